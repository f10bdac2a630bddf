"""The simulated engine's GPUs as a GPU source: ``GET /parasweep_sim/gpus`` read like NVML.

The simulated engine computes per-GPU power, utilisation, memory and an energy counter from its model
(``simulator/gpus.py``); this reader hands those rows to the :class:`GpuSampler` exactly as the NVML
reader hands it measured ones, so every later step reads one series whatever the source. The rows are
simulated: the sampler's source name (``simulated``) says so wherever a person reads them.
"""

from __future__ import annotations

import http.client
import math
from typing import Any
from urllib.parse import urlsplit

import orjson

from simulator.gpus import GPUS_PATH
from vocab.telemetry import GpuSource


class SimulatedGpuReader:
    """A :class:`orchestrator.telemetry.gpu_sampler.GpuReader` over the simulated engine at ``base_url``.

    One kept-alive HTTP connection (a request costs well under a millisecond, fine at 10 Hz); a
    connection the server dropped is reopened once per read. Anything else (an HTTP error status, a
    timeout, a server that went away) raises: the sampler counts it and goes on."""

    name = GpuSource.SIMULATED

    def __init__(self, base_url: str, timeout_s: float = 2.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"simulated GPU source: base_url {base_url!r} is not an http://host:port URL")
        self._host, self._port = parts.hostname, parts.port or 80
        self._path = parts.path.rstrip("/") + GPUS_PATH
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def read(self, energy: bool = True) -> list[dict[str, Any]]:
        """One row per simulated GPU. Its energy counter costs nothing more to read: every row carries
        it, whatever ``energy`` asks."""
        try:
            try:
                status, body = self._get()
            except (ConnectionError, http.client.HTTPException):
                # the kept-alive connection was closed by the other side: reopen it and ask again
                self.close()
                status, body = self._get()
        except BaseException:
            self.close()
            raise
        if status != 200:
            raise RuntimeError(f"GET {self._path} answered HTTP {status}: {body[:200]!r}")
        rows = orjson.loads(body)["gpus"]
        # JSON has no NaN: the server writes a value it cannot model as null
        return [{k: math.nan if v is None else v for k, v in row.items()} for row in rows]

    def _get(self) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        self._conn.request("GET", self._path)
        resp = self._conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ServersGpuReader:
    """The simulated GPUs of several servers (a disaggregated deployment's, in placement order: prefill
    servers first) as one trial's: each server's rows, numbered on after the previous server's GPUs."""

    name = GpuSource.SIMULATED

    def __init__(self, base_urls: list[str], timeout_s: float = 2.0) -> None:
        self._readers = [SimulatedGpuReader(url, timeout_s) for url in base_urls]

    def read(self, energy: bool = True) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for reader in self._readers:
            first = len(rows)
            for row in reader.read(energy):
                gpu = first + int(row["gpu"])
                rows.append({**row, "gpu": gpu, "uuid": f"sim-{gpu}"})
        return rows

    def close(self) -> None:
        for reader in self._readers:
            reader.close()

