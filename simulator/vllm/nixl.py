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
pricing as SGLang's transfers). The handshake's one-time cost per pair is not priced. Here: the
connector's model on one clock; a live server's side channel in ``simulator/vllm/nixl_live.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

from packaging.version import Version

from simulator.disagg.kv_transfer import Link, Path, send
from simulator.entities import KVHold, Request
from simulator.timebase import Simulation
from simulator.vllm.scheduler import VLLMReplica

SIDE_CHANNEL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT's default
ABORT_TIMEOUT_S = 480.0  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT's default
READ_PATH = "/sim/nixl_read"


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
