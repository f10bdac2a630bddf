"""The same engine model in virtual time: a closed-loop load point runs in milliseconds of CPU.

This is the seed of ``run.py predict=true``: ``predict_closed_loop(cfg, concurrency=8, ...)`` returns
the metrics a measured load point reports (throughput, TTFT/ITL/TPOT percentiles, stage busy).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from simulator.clock import Simulation, VirtualDriver
from simulator.engine import Engine, Request
from simulator.resolve import SimConfig


@dataclass
class PointPrediction:
    concurrency: int
    requests: int
    duration_s: float
    output_tok_s: float
    request_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    itl_p50_ms: float
    stage_busy_fraction: list[float] = field(default_factory=list)


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def predict_closed_loop(cfg: SimConfig, concurrency: int, input_len: int, output_len: int,
                        requests: int, horizon_s: float = 1e6) -> PointPrediction:
    """``concurrency`` clients each keep one request in flight until ``requests`` have been sent."""
    sim = Simulation()
    driver = VirtualDriver(sim)
    engines = [Engine(cfg, sim, r) for r in range(cfg.dp)]
    done: list[Request] = []
    sent = 0

    def send() -> None:
        nonlocal sent
        if sent >= requests:
            return
        req = Request(f"p{sent}", input_len, output_len, cfg.random_seed * 1_000_003 + sent)
        req.notify = lambda r=req: on_output(r)
        engines[sent % cfg.dp].submit(req, sim.now)
        sent += 1

    def on_output(req: Request) -> None:
        if req.finished and req.notify is not None:
            req.notify = None
            done.append(req)
            send()

    for _ in range(min(concurrency, requests)):
        send()
    driver.run_until(horizon_s)
    if not done:
        raise RuntimeError("no request finished within the horizon")
    t0 = min(r.arrival for r in done)
    t1 = max(r.finish_time for r in done)
    dur = max(t1 - t0, 1e-12)
    ttft = [(r.first_token_time - r.arrival) * 1e3 for r in done]
    tpot = [(r.finish_time - r.first_token_time) / (len(r.output_ids) - 1) * 1e3
            for r in done if len(r.output_ids) > 1]
    busy = [eng.busy[s].busy_total(t1) / t1 for eng in engines for s in range(cfg.pp)] if t1 > 0 else []
    return PointPrediction(
        concurrency=concurrency,
        requests=len(done),
        duration_s=dur,
        output_tok_s=sum(len(r.output_ids) for r in done) / dur,
        request_s=len(done) / dur,
        ttft_p50_ms=_pct(ttft, 0.5),
        ttft_p99_ms=_pct(ttft, 0.99),
        tpot_p50_ms=statistics.median(tpot) if tpot else float("nan"),
        itl_p50_ms=statistics.median(tpot) if tpot else float("nan"),
        stage_busy_fraction=busy,
    )
