"""Faults the simulated engine injects on purpose (``--sim-fault-*`` flags), so that parasweep's own
failure handling can be exercised against a real process over real HTTP: a crash, a start-up that never
ends or fails out of memory, a deadlocked engine, and streams that stall, break or carry garbage.

What each flag does is in docs/simulator.md, "Fault injection". The pieces here:

- ``FaultConf``: the flags as parsed (``cli.py`` validates them);
- ``request_fault``: which fault, if any, request number ``index`` gets. A pure function of the seed
  (``--random-seed``) and the index, so a run with the same seed and the same request order meets the
  same faults;
- ``FaultInjector``: counts generation requests as they arrive and crashes or freezes the engine at the
  configured one;
- ``StreamTap``: writes one stream's SSE chunks and injects that stream's fault;
- ``hold_readiness`` and ``fail_start_out_of_memory``: the start-up faults.

Predictions (``predict.py``) parse the same flags and ignore them: faults are not part of the model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import NoReturn

from aiohttp import web

from simulator.logs import LogWriter, rank_tag, scheduler_tag
from simulator.sim_config import GIB, SimConfig

# The stream faults, in the order they take their share of [0, 1) (see ``request_fault``).
HTTP_ERROR, CUT, STALL, MALFORMED = "http_error", "cut", "stall", "malformed"
# One event a client cannot parse: a ``data:`` line whose payload is cut-off JSON.
MALFORMED_EVENT = b'data: {"text": "malformed event injected by --sim-fault-malformed-sse-fraction\n\n'
HTTP_ERROR_MESSAGE = "Internal server error (simulated fault: --sim-fault-http-error-fraction)"
# SGLang's launcher says this when a scheduler process dies (its SIGQUIT handler), then kills the tree.
CHILD_FAILED = "Received sigquit from a child process. It usually means the child failed."
STALL_POLL_S = 0.5  # how often a stalled stream looks whether its client has gone


@dataclass(frozen=True)
class FaultConf:
    """The ``--sim-fault-*`` flags (defaults: no fault). Same fields as the orchestrator's
    ``engine.sim_faults`` config."""

    crash_after_requests: int | None = None
    hang_before_ready: bool = False
    startup_delay_s: float = 0.0
    hang_after_requests: int | None = None
    stall_stream_fraction: float = 0.0
    http_error_fraction: float = 0.0
    malformed_sse_fraction: float = 0.0
    cut_stream_fraction: float = 0.0
    oom_at_start: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultConf:
        return cls(**{f.name: getattr(args, f"sim_fault_{f.name}") for f in fields(cls)})

    def active(self) -> dict[str, object]:
        """The fields set to something other than their default (for logs and ``/server_info``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def shares(self) -> tuple[tuple[str, float], ...]:
        return ((HTTP_ERROR, self.http_error_fraction), (CUT, self.cut_stream_fraction),
                (STALL, self.stall_stream_fraction), (MALFORMED, self.malformed_sse_fraction))


def _uniform(seed: int, index: int) -> float:
    """A number in [0, 1) fixed by (seed, index): independent of arrival timing and of other requests."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def request_fault(conf: FaultConf, seed: int, index: int) -> str | None:
    """The fault of generation request number ``index`` (1-based, in arrival order): ``HTTP_ERROR``,
    ``CUT``, ``STALL``, ``MALFORMED`` or None.

    One draw per request, and each fault owns its own slice of [0, 1) (http error first, then cut,
    stall, malformed), so a request meets at most one of them and each fraction holds exactly (in
    expectation) while they sum to at most 1; beyond that the later ones get what is left. The stream
    faults apply to streamed requests only: a non-streamed request whose draw falls in their slices
    is served normally, so each is a fraction of streams."""
    u = _uniform(seed, index)
    edge = 0.0
    for kind, share in conf.shares():
        if edge <= u < edge + share:
            return kind
        edge += share
    return None


class FaultInjector:
    """Counts the generation requests (``/generate``, ``/v1/completions``, ``/v1/chat/completions``) as
    they arrive; crashes the process or freezes the engine at the configured request."""

    def __init__(self, conf: FaultConf, cfg: SimConfig, log: LogWriter, freeze: Callable[[], None]) -> None:
        self.conf = conf
        self.cfg = cfg
        self.log = log
        self.freeze = freeze  # stops the engine for good: no event of the model runs again
        self.arrived = 0
        # the per-request draw costs a hash: skip it on the hot path when no fraction is set
        self.draws = any(share > 0 for _, share in conf.shares())

    def arrive(self) -> str | None:
        """One more generation request has arrived: apply the count faults, return its own fault."""
        self.arrived += 1
        n = self.arrived
        if n == self.conf.crash_after_requests:
            self._crash(n)
        if n == self.conf.hang_after_requests:
            self.log.warning(f"Simulated fault (--sim-fault-hang-after-requests {n}): the engine is "
                             "deadlocked from now on; no request gets another token")
            self.freeze()
        return request_fault(self.conf, self.cfg.random_seed, n) if self.draws else None

    def _crash(self, n: int) -> NoReturn:
        """Die as SGLang does when its scheduler process raises: the scheduler logs the traceback, the
        launcher gets SIGQUIT and kills the whole process tree with SIGKILL (open connections drop)."""
        tb = _traceback_of(lambda: _scheduler_step_fails(n))
        err = LogWriter(self.cfg.args.log_level, sys.stderr)
        # with several schedulers (attention-DP ranks, DP replicas) the one that fails is the one the
        # request was dealt to round-robin (the warm-up request took the first turn)
        err.log(f"Scheduler hit an exception: {tb}", scheduler_tag(self.cfg, 0, n % self.cfg.schedulers),
                "error")
        err.log(CHILD_FAILED, level="error")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL is not caught")  # pragma: no cover


def _traceback_of(fail: Callable[[], object]) -> str:
    """The traceback ``fail`` raises, as Python prints it (a real one, from this module's frames)."""
    try:
        fail()
    except RuntimeError:
        return traceback.format_exc().rstrip()
    raise AssertionError("the injected failure did not raise")


def _scheduler_step_fails(n: int) -> NoReturn:
    raise RuntimeError(f"simulated scheduler failure at generation request {n} "
                       f"(--sim-fault-crash-after-requests {n})")


class OutOfMemoryError(RuntimeError):
    """Printed as ``torch.OutOfMemoryError`` in the traceback, the name log readers look for."""

    __module__ = "torch"


def _allocate_kv_pool(cfg: SimConfig) -> NoReturn:
    """Fail the KV pool allocation with PyTorch's CUDA OOM message. The sizes are the simulated model's
    (GPU memory of the hardware profile, this stage's weights and KV pool); the free memory is set below
    the request, as when something else holds the GPU."""
    st = cfg.stages[0]
    total = cfg.hw.memory_gb * 1e9 / GIB
    want = st.kv_bytes / GIB
    used = st.weight_bytes / GIB
    free = min(want / 2, max(total - used, 0.0))
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a total capacity of {total:.2f} "
        f"GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has "
        f"{used:.2f} GiB memory in use. Of the allocated memory {used:.2f} GiB is allocated by PyTorch, "
        "and 0.00 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def fail_start_out_of_memory(cfg: SimConfig, log: LogWriter) -> int:
    """``--sim-fault-oom-at-start``: log a CUDA OOM at KV-pool allocation the way SGLang's start-up logs
    it (the scheduler's traceback, then the launcher's line) and return exit code 1, before the port is
    bound, so no health check ever answers."""
    log.warning("Simulated fault (--sim-fault-oom-at-start): the KV cache allocation runs out of memory")
    tag = rank_tag(cfg, 0)
    log.info(f"Load weight begin. avail mem={cfg.hw.memory_gb * 1e9 / GIB:.2f} GB", tag)
    tb = _traceback_of(lambda: _allocate_kv_pool(cfg))
    err = LogWriter(cfg.args.log_level, sys.stderr)
    err.log(f"Scheduler hit an exception: {tb}", tag, "error")
    err.log(CHILD_FAILED, level="error")
    return 1


async def hold_readiness(conf: FaultConf, started: float, stop: asyncio.Event, log: LogWriter) -> bool:
    """Whether the server may now report ready: never with ``--sim-fault-hang-before-ready`` (the caller
    waits for SIGTERM instead), and only ``--sim-fault-startup-delay-s`` wall seconds after ``started``
    (False if SIGTERM came first)."""
    if conf.hang_before_ready:
        log.warning("Simulated fault (--sim-fault-hang-before-ready): this server never becomes ready")
        return False
    left = started + conf.startup_delay_s - time.time()
    if left > 0:
        log.warning(f"Simulated fault (--sim-fault-startup-delay-s {conf.startup_delay_s:g}): "
                    f"ready in {left:.1f} s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), left)
    return not stop.is_set()


class StreamTap:
    """Writes one stream's SSE chunks, injecting the stream's fault at its point: after the first write
    that carries tokens, or just before the write that would end the stream if that comes first (so a
    cut or stalled stream never gets its final chunk or ``[DONE]``).

    - ``MALFORMED``: one unparseable event follows that write; the stream then goes on and ends normally.
    - ``STALL``: the engine drops the request and the connection stays open and silent until the client
      closes it.
    - ``CUT``: the engine drops the request and the server closes the TCP connection (no final chunk,
      no terminating chunk of the chunked body).

    ``write`` returns False once a stall or cut has ended the stream: the handler then returns its
    response, whose closing write meets the closed connection and is dropped quietly by aiohttp, as
    after a client disconnect."""

    __slots__ = ("abort", "fault", "request", "resp")

    def __init__(self, fault: str | None, request: web.Request, resp: web.StreamResponse,
                 abort: Callable[[], None]) -> None:
        self.fault = fault if fault in (CUT, STALL, MALFORMED) else None
        self.request = request
        self.resp = resp
        self.abort = abort  # the engine forgets the stream's requests

    async def write(self, data: bytes, final: bool) -> bool:
        """Write ``data`` (``final``: it would end the stream); False if the stream is over."""
        fault = self.fault
        if fault is None:
            await self.resp.write(data)
            return True
        self.fault = None  # one fault per stream
        if fault == MALFORMED:
            await self.resp.write(data + MALFORMED_EVENT)
            return True
        if not final:
            await self.resp.write(data)
        self.abort()
        transport = self.request.transport
        if fault == STALL:
            while transport is not None and not transport.is_closing():
                await asyncio.sleep(STALL_POLL_S)
        elif transport is not None:
            transport.close()  # buffered chunks are flushed first, then FIN without the last chunk
        return False
