"""vLLM's NIXL KV connector (``--kv-transfer-config '{"kv_connector": "NixlConnector", ...}'``) as the
simulated engine plays it: a request computed on one server (prefill) and continued on another (decode),
the second reading the first one's KV blocks.

As read from the wheels of every played release (``nixl_connector.py``; ``nixl/`` from 0.34) and
vllm-router's PD mode, which drives it:

* the router sends the client's request to a prefill server first, with ``max_tokens`` 1 and
  ``kv_transfer_params: {"do_remote_decode": true, ...}``. The server runs it as any request; once it has
  finished, its blocks are not freed (``request_finished`` delays the free) and the answer carries
  ``kv_transfer_params`` naming them, the server's engine and its side channel (host and port:
  ``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``_PORT``, default localhost:5600). Blocks nobody reads are freed after
  ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` (480 s);
* the router then sends the client's request to a decode server with those parameters
  (``do_remote_prefill`` true). Its scheduler takes blocks for the prompt tokens its own prefix cache lacks
  and starts reading them, spending none of the step's token budget (``WAITING_FOR_REMOTE_KVS``); once they
  are in, all the prompt but its last token counts as computed, and the next step computes that token for
  the logits of the first output token. A read that fails is computed locally (vLLM's default
  ``recompute`` policy). The prefill server frees the blocks once read.

The read itself (NIXL over RDMA after a ZMQ handshake on the side channel) is here one HTTP call to the
prefill server's side channel (``READ_PATH``), answered when its model has moved the bytes: the prompt's
KV per GPU over the path between the two servers' nodes (``simulator/disagg/kv_transfer.py``, the same
pricing as SGLang's transfers). The handshake's one-time cost per pair is not priced.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from packaging.version import Version

from simulator.disagg.kv_transfer import KVSide, Link, Path, bytes_per_token, path_between, send
from simulator.disagg.peer import PeerClient
from simulator.entities import KVHold, KVPull, Request
from simulator.logs import LogWriter
from simulator.sim_config import SimConfig
from simulator.timebase import Simulation
from simulator.vllm.flag_json import json_object
from simulator.vllm.metrics import NixlMetrics
from simulator.vllm.scheduler import VLLMReplica

NIXL = "NixlConnector"
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
SIDE_CHANNEL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT's default
ABORT_TIMEOUT_S = 480.0  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default
READ_PATH = "/sim/nixl_read"


class KVTransferConfigError(ValueError):
    """A ``--kv-transfer-config`` vLLM refuses, or one the simulated engine does not model."""


@dataclass(frozen=True)
class KVTransferConf:
    connector: str
    role: str


def parse_kv_transfer_config(text: str) -> KVTransferConf:
    """``--kv-transfer-config``'s JSON: vLLM's own checks (``KVTransferConfig.__post_init__``), then the
    one connector the simulated engine plays."""
    raw = json_object("--kv-transfer-config", text, KVTransferConfigError)
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if role is not None and role not in KV_ROLES:
        raise KVTransferConfigError(f"Unsupported kv_role: {role}. Supported roles are {list(KV_ROLES)}")
    if connector is not None and role is None:
        raise KVTransferConfigError("Please specify kv_role when kv_connector is set, supported roles are "
                                    f"{list(KV_ROLES)}")
    if connector != NIXL:
        raise KVTransferConfigError(f"kv_connector {connector!r} is not modelled by the simulated engine "
                                    f"(modelled: {NIXL})")
    return KVTransferConf(connector, role)


def side_channel() -> tuple[str, int]:
    """This server's NIXL side channel, from the environment as vLLM reads it."""
    return (os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
            int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", str(SIDE_CHANNEL_PORT))))


def transfer_params(release: str, req: Request, key: str, engine_id: str, host: str, port: int, tp: int,
                    pp: int, block_size: int, expiry: float) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill server answers with for held request ``req`` (known to the
    decode side as ``key``), as ``request_finished`` of ``release`` writes them: ``remote_request_id``
    from 0.15, block ids one list per KV-cache group from 0.18, the pull scheduler's extra fields in 0.34."""
    v = Version(release)
    blocks = list(range(-(-req.input_len // block_size)))
    params: dict[str, Any] = {"do_remote_prefill": True, "do_remote_decode": False,
                              "remote_block_ids": [blocks] if v >= Version("0.18") else blocks,
                              "remote_engine_id": engine_id}
    if v >= Version("0.15"):
        params["remote_request_id"] = key
    params.update(remote_host=host, remote_port=port, tp_size=tp)
    if v >= Version("0.34"):
        params.update(dcp_size=1, pp_size=pp, remote_num_tokens=req.input_len,
                      remote_blocks_expiry_time=expiry, remote_registration_generation=0,
                      transfer_mode="pull")
    return params


class HeldKV:
    """A server's finished requests whose KV waits for a decode server's read, by the key the decode side
    knows them by; freed when read, or after the abort timeout (None: none, every request being read, as
    on one clock). A read that comes before its request has finished here (the router sends the decode
    request once the prefill's answer is out) waits for it."""

    def __init__(self, sim: Simulation, replicas: list[VLLMReplica],
                 timeout_s: float | None = ABORT_TIMEOUT_S,
                 on_expired: Callable[[], None] | None = None) -> None:
        self.sim, self.replicas, self.timeout_s, self.on_expired = sim, replicas, timeout_s, on_expired
        self.by_key: dict[str, Request] = {}
        self.pending: set[str] = set()  # accepted, not finished yet
        self.readers: dict[str, Callable[[], bool]] = {}  # reads waiting for their request to finish
        self.link = Link(sim)  # this server's GPU links, which its transfers queue on

    def hold(self, key: str, then: Callable[[Request], None] | None = None) -> KVHold:
        """What a request to be read under ``key`` carries; ``then(req)`` once it has finished here."""
        self.pending.add(key)

        def held(req: Request) -> None:
            self.pending.discard(key)
            self.by_key[key] = req
            if self.timeout_s is not None:
                self.sim.schedule(self.sim.now + self.timeout_s, self._expire, key, req)
            reader = self.readers.pop(key, None)
            if reader is not None:
                reader()
            if then is not None:
                then(req)

        return KVHold(held)

    def _free(self, req: Request) -> None:
        for replica in self.replicas:
            if replica.free_read(req.rid):
                return

    def _expire(self, key: str, req: Request) -> None:
        if self.by_key.get(key) is req:
            del self.by_key[key]
            self._free(req)
            if self.on_expired is not None:
                self.on_expired()

    def read(self, key: str, receiver: Link, nbytes: float, path: Path,
             done: Callable[[float], None]) -> bool:
        """Move ``nbytes`` per GPU of held ``key``'s KV to ``receiver`` (once its request has finished);
        its blocks are freed and ``done(end)`` told at the end. False where no request has that key."""
        if key in self.pending:
            self.readers[key] = partial(self.read, key, receiver, nbytes, path, done)
            return True
        req = self.by_key.pop(key, None)
        if req is None:
            return False

        def moved(end: float) -> None:
            self._free(req)
            done(end)

        send(self.sim, self.link, receiver, nbytes, path, moved)
        return True


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
