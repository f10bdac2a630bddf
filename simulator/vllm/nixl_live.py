"""A live simulated vLLM server's NIXL connector (``simulator/vllm/nixl.py`` holds the connector's model
and what was read from the wheels): each request's ``kv_transfer_params`` read and answered, the side
channel served over HTTP, and KV read from other servers' side channels over it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from simulator.disagg.kv_transfer import KVSide, Link, bytes_per_token, path_between
from simulator.disagg.peer import PeerClient
from simulator.entities import KVHold, KVPull, Request
from simulator.logs import LogWriter
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation
from simulator.vllm.metrics import NixlMetrics
from simulator.vllm.nixl import ABORT_TIMEOUT_S, READ_PATH, HeldKV, side_channel, transfer_params
from simulator.vllm.scheduler import VLLMReplica


class LiveNixl:
    """A live server's connector: it reads each request's ``kv_transfer_params``, answers a prefill's with
    its own, serves the side channel and reads KV from other servers' side channels."""

    def __init__(self, cfg: SimConfig, sim: Simulation, replicas: list[VLLMReplica], now: Callable[[], float],
                 loop: asyncio.AbstractEventLoop, log: LogWriter, metrics: NixlMetrics) -> None:
        self.cfg, self.sim, self.replicas, self.now, self.loop, self.log = cfg, sim, replicas, now, loop, log
        self.metrics = metrics
        self.engine_id = str(uuid.uuid4())
        self.host, self.port = side_channel()
        expired = metrics.expired.labels(**metrics.labels(0))
        self.held = HeldKV(sim, replicas, on_expired=expired.inc)
        self.side = KVSide.of(cfg)
        self.kv = asdict(self.side)
        self.peer = f"{cfg.args.host}:{cfg.args.port}"
        self.receivers: dict[str, Link] = {}  # each decode server's link, as this server's reads use it
        self._keys: dict[str, str] = {}  # a held request's rid -> the key the decode side reads it by
        self.client = PeerClient(loop)

    # -- requests in and answers out --------------------------------------------------------------------

    def accept(self, body: dict[str, Any], request_id: str | None, req: Request) -> None:
        """``req``'s part in a transfer, from its body's ``kv_transfer_params`` (``request_id``: its
        ``X-Request-Id``, which vLLM makes the request's id)."""
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict):
            return
        if params.get("do_remote_decode"):
            key = request_id or req.rid
            self._keys[req.rid] = key
            req.remote = self.held.hold(key)
        elif params.get("do_remote_prefill") and params.get("remote_block_ids"):
            key = params.get("remote_request_id") or request_id
            host, port = params.get("remote_host"), params.get("remote_port")
            if key is None or host is None or port is None:
                self.log.warning(f"Got invalid KVTransferParams: {params}. This request will not utilize "
                                 "KVTransfer", "nixl_connector.py:1")
                return
            req.remote = KVPull(lambda r, tokens: self._read_soon(r, tokens, str(key), str(host), int(port)))

    def answer(self, req: Request) -> dict[str, Any]:
        """What a finished request's answer carries: a held one's ``kv_transfer_params``."""
        key = self._keys.pop(req.rid, None)
        if key is None or not isinstance(req.remote, KVHold):
            return {}
        cfg = self.cfg
        expiry = time.time() + ABORT_TIMEOUT_S
        return {"kv_transfer_params": transfer_params(cfg.args.vllm_release, req, key, self.engine_id,
                                                      self.host, self.port, cfg.rank_tp, cfg.pp,
                                                      cfg.page_size, expiry)}

    # -- the side channel -------------------------------------------------------------------------------

    async def read_handler(self, request: web.Request) -> web.Response:
        """``POST READ_PATH`` from a decode server: answered once the KV has moved."""
        body = await request.json(loads=orjson.loads)
        key, tokens, node, peer = str(body["key"]), int(body["tokens"]), int(body["node"]), str(body["peer"])
        per_token = bytes_per_token(self.side, KVSide(**body["kv"]))
        path = path_between(self.cfg, node == self.cfg.args.sim_pd_node)
        done: asyncio.Future = self.loop.create_future()
        receiver = self.receivers.setdefault(peer, Link(self.sim))

        def moved(end: float) -> None:
            if not done.done():
                done.set_result(end)

        def start() -> None:  # on the engine's clock
            if not self.held.read(key, receiver, tokens * per_token, path, moved) and not done.done():
                done.set_exception(KeyError(key))

        started = self.now()
        self.sim.schedule(started, start)
        try:
            end = await done
        except KeyError:
            return web.json_response({"error": f"no KV held for request {key}"}, status=404)
        return web.json_response({"transfer_s": end - started, "bytes": tokens * per_token})

    # -- reading from other servers ---------------------------------------------------------------------

    def _read_soon(self, req: Request, tokens: int, key: str, host: str, port: int) -> None:
        self.client.spawn(self._read(req, tokens, key, host, port))

    def _replica_of(self, req: Request) -> VLLMReplica:
        return next(r for r in self.replicas if req in r.admission.reading)

    async def _read(self, req: Request, tokens: int, key: str, host: str, port: int) -> None:
        body = {"key": key, "tokens": tokens, "node": self.cfg.args.sim_pd_node, "peer": self.peer,
                "kv": self.kv}
        replica = self._replica_of(req)
        labels = self.metrics.labels(self.replicas.index(replica))
        try:
            read = await self.client.post(f"http://{host}:{port}{READ_PATH}", body)
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self.log.error(f"NIXL transfer of request {key} from {host}:{port} failed ({e}); its prompt is "
                           "computed locally", "nixl_connector.py:1")
            self.metrics.failed.labels(**labels).inc()
            self.sim.schedule(self.now(), replica.remote_kv_failed, req)
            return
        self.metrics.xfer_time.labels(**labels).observe(read["transfer_s"])
        self.metrics.bytes.labels(**labels).observe(read["bytes"])
        self.sim.schedule(self.now(), replica.remote_kv_in, req)

    async def close(self) -> None:
        await self.client.close()
