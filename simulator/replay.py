"""A benchmark run replayed in virtual time: a fixed list of requests, each sent at its own offset.

Where ``predict.py`` drives the model with parasweep's load points (closed loop, steady windows), this
drives it the way a published benchmark did (``workloads.bench_serving``): every request's prompt and
output length given, sent at its offset from the run's start, at most ``max_concurrency`` in flight
(the rest wait in arrival order and count their latencies from their actual send). The engine starts
empty and idle after its own warm-up, as a server is when bench_serving's run begins (its warm-up
request has run too).

Each request's prompt is random token ids (a seeded generator), so no two prompts share a prefix: the
random datasets have none, and ShareGPT's first turns almost none. A request asking for 0 output tokens
(bench_serving's random lengths can draw 0) is run for one token, its prefill's; its record keeps the
length asked for, because bench_serving counts that.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from simulator.predict import MAX_EVENTS_PER_POINT, VirtualTrial, record_emission
from simulator.sim_config import SimConfig
from vocab.records import RequestRecord
from workloads.bench_serving import BenchRequest

LABEL = "replay"


def replay(cfg: SimConfig, requests: Sequence[BenchRequest], max_concurrency: int | None = None,
           seed: int = 0) -> list[RequestRecord]:
    """Every request of ``requests`` through a fresh engine configured as ``cfg``; one record each, in
    order, with times in virtual seconds from the run's start."""
    return replay_on(VirtualTrial(cfg), requests, max_concurrency, seed)


def replay_on(trial: VirtualTrial, requests: Sequence[BenchRequest], max_concurrency: int | None = None,
              seed: int = 0) -> list[RequestRecord]:
    """``replay`` on a fresh virtual trial of any kind: one engine, or a disaggregated deployment
    (``predict_disagg.PDLayout.fresh()``), whose router pairs each request's servers."""
    sim = trial.sim
    rng = np.random.default_rng(seed)
    vocab = trial.cfg.spec.vocab
    records = [RequestRecord(point=LABEL, index=i, scheduled_time=r.offset_s, input_tokens=r.input_len)
               for i, r in enumerate(requests)]
    held: collections.deque[int] = collections.deque()
    in_flight = 0

    def send(i: int) -> None:
        nonlocal in_flight
        spec = requests[i]
        rec = records[i]
        rec.send_time = rec.first_byte_time = sim.now
        prompt = rng.integers(0, vocab, size=max(spec.input_len, 1), dtype=np.int64)
        req = trial.submit(prompt, max(spec.output_len, 1))
        in_flight += 1

        emitted = 0

        def on_output() -> None:
            nonlocal in_flight, emitted
            emitted = record_emission(req, rec, sim.now, emitted)
            if req.finished and rec.end_time is None:
                rec.end_time = sim.now
                rec.output_tokens = spec.output_len
                rec.finish_reason = "length"
                req.notify = None
                in_flight -= 1
                if held:
                    send(held.popleft())

        req.notify = on_output

    def arrive(i: int) -> None:
        if max_concurrency and in_flight >= max_concurrency:
            held.append(i)
        else:
            send(i)

    t0 = sim.now  # the engine's warm-up ran before
    for i, r in enumerate(requests):
        sim.schedule(t0 + r.offset_s, arrive, i)
    events = 0
    while sim.peek() is not None:
        events += sim.run_until(sim.peek() + 1.0)
        if events > MAX_EVENTS_PER_POINT * 10:
            raise RuntimeError(f"the replay did not drain after {events} events")
    unfinished = [r.index for r in records if r.end_time is None]
    if unfinished:
        raise RuntimeError(f"the replay left requests {unfinished[:5]} unfinished")
    for rec in records:  # times from the run's start
        rec.send_time = rec.first_byte_time = rec.send_time - t0  # type: ignore[operator]
        rec.first_token_time = None if rec.first_token_time is None else rec.first_token_time - t0
        rec.end_time = rec.end_time - t0  # type: ignore[operator]
        rec.chunk_times = [t - t0 for t in rec.chunk_times]
    return records
