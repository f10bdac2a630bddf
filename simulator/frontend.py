"""Between the HTTP handlers and the replica models, the role SGLang's tokenizer manager plays: checks a
request's lengths, hands it to a DP replica (``router.py``: round-robin or cache-aware), aborts it when
its client goes away, and wakes the handler that waits for its tokens (no polling: the model calls
``Request.notify``).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import numpy as np

from simulator.entities import Request
from simulator.replica import ReplicaModel
from simulator.router import Router
from simulator.sim_config import SimConfig

if TYPE_CHECKING:
    from simulator.disagg.live import Bootstrap, LiveDecode, LivePrefill


class BadRequest(Exception):
    """A request the server answers with 400 (SGLang's message where SGLang has one)."""


class _Waiter:
    """One future at a time, resolved by the model's ``notify``."""

    __slots__ = ("fut", "loop", "only_on_finish", "reqs")

    def __init__(self, loop: asyncio.AbstractEventLoop, reqs: list[Request], only_on_finish: bool) -> None:
        self.loop = loop
        self.fut: asyncio.Future | None = None
        self.reqs = reqs
        self.only_on_finish = only_on_finish
        for r in reqs:
            r.notify = self.wake

    def wake(self) -> None:
        fut = self.fut
        if fut is None or fut.done():
            return
        if self.only_on_finish and not all(r.finished for r in self.reqs):
            return
        fut.set_result(None)

    async def wait(self) -> None:
        self.fut = self.loop.create_future()
        try:
            await self.fut
        finally:
            self.fut = None


class Frontend:
    def __init__(self, cfg: SimConfig, replicas: list[ReplicaModel], now: Callable[[], float],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.replicas = replicas
        self.now = now  # simulated time of the wall clock's present
        self.loop = loop
        self.router = Router(cfg.router, cfg.schedulers)
        self._rid_seq = itertools.count(1)
        self._output_waiters: list[asyncio.Future] = []
        self.pd: LivePrefill | LiveDecode | None = None  # a disaggregated server's role takes requests
        for rep in replicas:
            rep.output_hook = self._on_output

    def _on_output(self) -> None:
        if self._output_waiters:
            for f in self._output_waiters:
                if not f.done():
                    f.set_result(None)
            self._output_waiters.clear()

    def next_output(self) -> asyncio.Future:
        """A future resolved at the next emission of any replica (the health probe's signal)."""
        fut = self.loop.create_future()
        self._output_waiters.append(fut)
        return fut

    def new_request(self, prompt: np.ndarray, max_new: int, stream: bool,
                    log_metrics: bool = True) -> Request:
        cfg = self.cfg
        input_len = len(prompt)
        if input_len >= cfg.context_len:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the model's context length "
                f"({cfg.context_len} tokens)."
            )
        if input_len > cfg.max_req_input_len:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the maximum request input length "
                f"({cfg.max_req_input_len} tokens) allowed by the KV cache."
            )
        if max_new < 0:
            raise BadRequest("max_new_tokens must be at least 0")
        if input_len + max_new > cfg.context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {cfg.context_len} "
                f"tokens. You requested a total of {input_len + max_new} tokens: {input_len} tokens from "
                f"the input messages and {max_new} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit."
            )
        seq = next(self._rid_seq)
        return Request(uuid.uuid4().hex, input_len, max(max_new, 1), cfg.random_seed * 1_000_003 + seq,
                       stream=stream, log_metrics=log_metrics, prompt=prompt)

    def submit(self, reqs: list[Request], bootstrap: Bootstrap | None = None) -> None:
        """Each request to its replica, or to the server's PD role with the router's bootstrap fields."""
        if self.pd is not None:
            for req in reqs:
                self.pd.submit(req, bootstrap)
            return
        now = self.now()
        for req in reqs:
            i = self.router.pick(req.prompt, [rep.load for rep in self.replicas])
            self.replicas[i].submit(req, now)

    def abort(self, reqs: list[Request]) -> None:
        for r in reqs:
            if not r.finished:
                self.replicas[0 if self.cfg.schedulers == 1 else self._replica_of(r)].abort(r)

    def _replica_of(self, req: Request) -> int:
        for i, rep in enumerate(self.replicas):
            if rep.holds(req):
                return i
        return 0

    async def outputs(self, reqs: list[Request]) -> AsyncIterator[list[int]]:
        """Yield, each time some request has new tokens, the indices of those requests, until all finish."""
        waiter = _Waiter(self.loop, reqs, only_on_finish=False)
        sent = [0] * len(reqs)
        done = [False] * len(reqs)
        try:
            while not all(done):
                ready = []
                for i, r in enumerate(reqs):
                    if done[i]:
                        continue
                    n = len(r.output_ids)
                    if n > sent[i] or r.finished:
                        ready.append(i)
                        sent[i] = n
                        if r.finished:
                            done[i] = True
                if ready:
                    yield ready
                else:
                    await waiter.wait()
        finally:
            for r in reqs:
                r.notify = None
            if not all(done):
                self.abort(reqs)

    async def wait_all(self, reqs: list[Request]) -> None:
        waiter = _Waiter(self.loop, reqs, only_on_finish=True)
        try:
            while not all(r.finished for r in reqs):
                await waiter.wait()
        finally:
            for r in reqs:
                r.notify = None
            if not all(r.finished for r in reqs):
                self.abort(reqs)
