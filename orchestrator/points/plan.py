"""A trial's workload as the load generator's objects: its load points and its request spec.

Shared by the trial (which drives them), the launcher's predictions and ``predict=true`` (which run
them in virtual time), so a prediction always describes the same requests a measurement sends.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from orchestrator.config.lengths import length_bounds
from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf, plays_vllm
from orchestrator.config.traffic import source_of
from orchestrator.points.ramp import predicted_durations


def load_points(cfg: ParasweepConf) -> list[Any]:
    """The workload's points. ``workload.ramp=auto`` asks the simulator's model for each closed-loop
    point's mean request duration (a burst start, in virtual time: milliseconds) and ramps its streams
    in over it; where the model cannot say, the streams start at once and the log says why."""
    from workloads import LoadPoint
    from workloads.sources import as_sessions, source_requests, trace_point

    w = cfg.workload
    points = []
    ramp = 0.0 if w.ramp == "auto" else float(w.ramp)
    spec = request_spec(cfg)
    source = source_requests(spec) if w.source != "random" else None
    for c in w.concurrency:
        n = w.requests_per_point or max(8, w.requests_per_concurrency * c)
        warmup = (w.warmup_requests if w.warmup_per_concurrency is None
                  else math.ceil(w.warmup_per_concurrency * c))
        points.append(as_sessions(LoadPoint(concurrency=c, num_requests=n, warmup_requests=warmup,
                                            ramp_s=ramp, ci_target=w.ci_target, duration_s=w.max_point_s),
                                  spec))
    for r in w.rate:
        n = w.requests_per_point or max(8, math.ceil(w.requests_per_concurrency * r))
        points.append(as_sessions(LoadPoint(rate=float(r), num_requests=n, warmup_requests=w.warmup_requests,
                                            arrival=w.arrival, ci_target=w.ci_target,
                                            duration_s=w.max_point_s), spec))
    if w.arrival == "trace":
        assert source is not None and source.times_s is not None
        points += [trace_point(source.times_s, speed, w.requests_per_point, w.warmup_requests,
                               w.max_point_s) for speed in w.trace_speed]
    if w.ramp == "auto" and w.concurrency:
        durations = predicted_durations(cfg, [p for p in points if not p.open_loop], request_spec)
        points = [dataclasses.replace(p, ramp_s=durations.get(p.label, 0.0)) for p in points]
    return points


def engine_api(cfg: ParasweepConf) -> str:
    """The API the load is sent to: ``workload.api``, except that vLLM has no ``/generate`` (SGLang's
    native API): its token-id prompts go to vLLM's ``/v1/completions``, which takes them as they are."""
    api = cfg.workload.api
    return "completions" if api == "generate" and plays_vllm(cfg) else api


def request_spec(cfg: ParasweepConf) -> Any:
    from workloads import RequestSpec

    model = model_info(cfg.model.path)
    w = cfg.workload
    input_max, output_max = length_bounds(cfg, model.max_context)
    return RequestSpec(api=engine_api(cfg), input_len=w.input_len, output_len=w.output_len, seed=w.seed,
                       vocab_size=model.vocab_size, model=cfg.model.name, input_dist=w.input_dist,
                       output_dist=w.output_dist, input_max_len=input_max, output_max_len=output_max,
                       source=None if w.source == "random" else source_of(cfg))
