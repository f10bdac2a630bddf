"""Prediction mode: the live server's engine model, run in virtual time from Python.

``predict_point(argv, point, spec)`` configures the engine exactly as ``python -m simulator <argv>`` would
(same parser, same ``resolve``), drives it with a *virtual client* that follows ``workloads``' load modes,
and returns a ``workloads.PointResult`` whose metrics come from ``workloads.summarize``. Nothing listens
on a socket and no wall clock is read: a Kimi K2 PP8 load point of 80 requests takes a few ms of CPU.

The virtual client, request by request, mirrors ``workloads.runner`` / ``workloads.scheduler``:

* closed loop (``concurrency``): ``min(C, total)`` workers; each sends the next index (warmup first) the
  instant its previous request ends;
* open loop (``rate``): request i is scheduled at ``point.send_offsets()[i]`` (the very same Poisson or
  constant schedule, same seed); ``max_concurrency`` holds a request back until one in flight ends;
* a request reaches the engine at its send time and the client sees each token the instant it is
  emitted (client lag 0; every emission event is one stream chunk); a request ends with its last token.
  A closed-loop worker's next request is sent ``CLIENT_TURNAROUND_S`` (1 ms) after the previous one
  ended: the HTTP/IPC round trip between an answer's last token and the next request's arrival, which a
  real client cannot avoid and which decides, under PP, whether the new request catches its slot's turn.
  The initial requests of a point all arrive at once.

Records are ``RequestRecord`` objects in *virtual seconds* of the model (t = 0 at the first point's
start). These are the hardware's seconds: ``--sim-time-scale`` only changes how fast the live server
plays them back, so predictions ignore it (a live simulated trial at scale F measures wall latencies
F times shorter).

Per point the metrics also carry the simulated telemetry the live path derives from ``/metrics``
(``parasweep_sim:stage_busy_seconds_total{pp_rank}``, ``parasweep_sim:gpu_power_watts{gpu}``):
``sim_stage_busy_mean/min/max`` (fraction of the point's window, first send to last end, that each PP
stage was busy; mean/min/max over all stages of all DP replicas) and ``sim_gpu_power_w_mean`` (mean over
the trial's GPUs of idle + busy x (limit - idle)), plus ``sim_peak_running_reqs`` and
``sim_peak_microbatches_in_flight``.
"""

from __future__ import annotations

import argparse
import collections
from typing import TYPE_CHECKING

from simulator.cli import build_parser
from simulator.clock import Simulation
from simulator.engine import Engine, Request
from simulator.resolve import ConfigError, SimConfig, resolve

if TYPE_CHECKING:
    from vocab.load import LoadPoint, RequestSpec
    from vocab.records import PointResult, RequestRecord

__all__ = ["VirtualTrial", "load_config", "predict_point", "predict_trial", "resolved_server_info"]

# Closed loop: simulated seconds from a request's last token leaving the scheduler to the same worker's
# next request reaching it. On one host this is detokenizer -> HTTP chunk -> client -> new HTTP request
# -> tokenizer manager -> scheduler: about 0.1 ms per hop over five hops (ZMQ, loopback TCP, Python
# handlers). It matters under PP: a request arriving after its slot's turn waits one ring period.
CLIENT_TURNAROUND_S = 1e-3
MAX_EVENTS_PER_POINT = 50_000_000  # a guard against a model bug turning into an endless loop


class _ArgError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = build_parser()

    def error(message: str) -> None:  # a library raises instead of exiting the process
        raise _ArgError(f"simulator flags: {message}")

    p.error = error  # type: ignore[method-assign]
    return p


def load_config(argv: list[str]) -> SimConfig:
    """``argv`` (SGLang + ``--sim-*`` flags, without ``python -m simulator``) -> the resolved config.

    Raises ``ValueError`` with the message the live server would print (bad flag, invalid layout,
    weights that do not fit, ...)."""
    args = _parser().parse_args([str(a) for a in argv])
    if args.random_seed is None:
        args.random_seed = 0  # token ids only; fixed so predictions are reproducible
    try:
        return resolve(args)
    except ConfigError as e:
        raise ValueError(str(e)) from e


def resolved_server_info(argv: list[str]) -> dict:
    """The dict ``GET /server_info`` of ``python -m simulator <argv>`` returns, without serving."""
    cfg = load_config(argv)
    info = cfg.server_info()
    info["launch_command"] = " ".join(["python", "-m", "simulator", *[str(a) for a in argv]])
    return info


class VirtualTrial:
    """One engine instance (all DP replicas) on one virtual clock; load points run one after another."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.sim = Simulation()
        self.engines = [Engine(cfg, self.sim, r) for r in range(cfg.dp)]
        self._rr = 0
        self._seq = 0
        self.turnaround = CLIENT_TURNAROUND_S

    # -- one point ------------------------------------------------------------------------------------

    def run_point(self, point: LoadPoint, spec: RequestSpec) -> PointResult:
        from vocab.records import PointResult, RequestRecord
        from workloads import summarize, validity_reasons

        sim, cfg = self.sim, self.cfg
        total = point.total_requests
        label = point.label
        lengths = _input_lengths(spec, total)
        n_out = spec.output_len
        records: list[RequestRecord | None] = [None] * total
        t0 = sim.now
        for eng in self.engines:
            eng.peak_in_flight = eng.in_flight
            eng.peak_pool_used = eng.pool_used
        busy0 = [eng.busy[s].busy_total(t0) for eng in self.engines for s in range(cfg.pp)]
        in_flight = 0
        pending: collections.deque[tuple[int, float | None]] = collections.deque()
        next_index = 0
        closed = point.concurrency is not None

        def send(i: int, scheduled: float | None) -> None:
            nonlocal in_flight
            now = sim.now
            rec = RequestRecord(point=label, index=i, warmup=i < point.warmup_requests,
                                scheduled_time=scheduled, send_time=now, first_byte_time=now,
                                input_tokens=spec.input_len)
            records[i] = rec
            self._seq += 1
            req = Request(f"v{self._seq}", lengths[i], n_out, cfg.random_seed * 1_000_003 + self._seq,
                          stream=True)
            req.notify = lambda: on_output(req, rec)
            in_flight += 1
            eng = self.engines[self._rr]
            self._rr = (self._rr + 1) % len(self.engines)
            eng.submit(req, now)

        def on_output(req: Request, rec: RequestRecord) -> None:
            nonlocal in_flight, next_index
            n = len(req.output_ids)
            if n > rec.output_tokens:
                now = sim.now
                if rec.first_token_time is None:
                    rec.first_token_time = now
                rec.chunk_times.append(now)
                rec.chunk_tokens.append(n - rec.output_tokens)
                rec.output_tokens = n
            if req.finished and rec.end_time is None:
                rec.end_time = sim.now
                rec.finish_reason = (req.finish_reason or {}).get("type", "length")
                req.notify = None
                in_flight -= 1
                if closed:
                    if next_index < total:
                        next_index += 1
                        if self.turnaround > 0:
                            sim.schedule(sim.now + self.turnaround, send, next_index - 1, None)
                        else:
                            send(next_index - 1, None)
                elif pending:
                    send(*pending.popleft())

        def open_send(i: int, scheduled: float) -> None:
            if point.max_concurrency and in_flight >= point.max_concurrency:
                pending.append((i, scheduled))
            else:
                send(i, scheduled)

        if closed:
            assert point.concurrency is not None
            for _ in range(min(point.concurrency, total)):
                next_index += 1
                send(next_index - 1, None)
        else:
            for i, off in enumerate(point.send_offsets().tolist()):
                sim.schedule(t0 + off, open_send, i, t0 + off)
        events = 0
        while sim.peek() is not None:
            events += sim.run_until(sim.peek() + 1.0)
            if events > MAX_EVENTS_PER_POINT:
                raise RuntimeError(f"prediction of {label} did not drain after {events} events")
        unfinished = [r.index for r in records if r is None or r.end_time is None]
        if unfinished:
            raise RuntimeError(f"prediction of {label}: requests {unfinished[:5]} never finished")

        metrics = summarize(records, point, lag_ms=[0.0])
        metrics.update(self._telemetry(records, busy0))
        reasons = validity_reasons(metrics, point)
        return PointResult(point, metrics, reasons, [r for r in records if r is not None])

    def _telemetry(self, records: list, busy0: list[float]) -> dict[str, float]:
        cfg, hw = self.cfg, self.cfg.hw
        start = min(r.send_time for r in records)
        end = max(r.end_time for r in records)
        width = end - start
        out: dict[str, float] = {
            "sim_peak_running_reqs": float(max(e.peak_pool_used for e in self.engines)),
            "sim_peak_microbatches_in_flight": float(max(e.peak_in_flight for e in self.engines)),
        }
        if width <= 0:
            return out
        # Busy seconds inside [start, end]: the point started on an idle engine, so nothing before
        # ``start`` overlaps the window and busy_total(end) - busy_total(start) is exact.
        fractions = []
        k = 0
        for eng in self.engines:
            for s in range(cfg.pp):
                fractions.append((eng.busy[s].busy_total(end) - busy0[k]) / width)
                k += 1
        out["sim_stage_busy_mean"] = sum(fractions) / len(fractions)
        out["sim_stage_busy_min"] = min(fractions)
        out["sim_stage_busy_max"] = max(fractions)
        # Every GPU of a stage (its tp ranks) has the stage's busy fraction; mean over GPUs = mean over
        # stages because each stage has the same number (tp) of GPUs.
        watts = [hw.idle_power_w + f * (hw.power_limit_w - hw.idle_power_w) for f in fractions]
        out["sim_gpu_power_w_mean"] = sum(watts) / len(watts)
        return out


def _input_lengths(spec: RequestSpec, total: int) -> list[int]:
    """The prompt length the live server would count for each request of ``spec``."""
    if spec.api != "chat":
        return [spec.input_len] * total  # token-id prompts (generate, completions): exact
    from simulator.text import count_chat_tokens
    from workloads.payloads import build_body

    # chat sends words; the live server estimates tokens from characters (no tokenizer), so count alike
    return [count_chat_tokens(build_body(spec, i)[0]["messages"]) for i in range(total)]


def predict_trial(argv: list[str], points: list[LoadPoint], spec: RequestSpec) -> list[PointResult]:
    """Every point of one trial on ONE engine instance, in order.

    Each point starts the instant the previous one drained (a live trial also starts the next point
    only after the previous one's requests ended). The engine's memory state does not carry over: a
    drained engine holds no running request and no KV (there is no prefix cache), so a point's result
    does not depend on the points before it; only virtual time and the scheduler's slot cursor do.
    """
    trial = VirtualTrial(load_config(argv))
    return [trial.run_point(p, spec) for p in points]


def predict_point(argv: list[str], point: LoadPoint, spec: RequestSpec) -> PointResult:
    """One load point against a fresh engine configured by ``argv``, in virtual time (see module doc)."""
    return predict_trial(argv, [point], spec)[0]
