"""A trial's workload as the load generator's objects: its load points and its request spec.

Shared by the trial (which drives them), the launcher's predictions and ``predict=true`` (which run
them in virtual time), so a prediction always describes the same requests a measurement sends.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf


def load_points(cfg: ParasweepConf) -> list[Any]:
    from workloads import LoadPoint

    w = cfg.workload
    points = []
    for c in w.concurrency:
        n = w.requests_per_point or max(8, w.requests_per_concurrency * c)
        points.append(LoadPoint(concurrency=c, num_requests=n, warmup_requests=w.warmup_requests))
    for r in w.rate:
        n = w.requests_per_point or max(8, math.ceil(w.requests_per_concurrency * r))
        points.append(LoadPoint(rate=float(r), num_requests=n, warmup_requests=w.warmup_requests,
                                arrival=w.arrival))
    return points


def request_spec(cfg: ParasweepConf) -> Any:
    from workloads import RequestSpec

    model = model_info(cfg.model.path)
    return RequestSpec(api=cfg.workload.api, input_len=cfg.workload.input_len,
                       output_len=cfg.workload.output_len, seed=cfg.workload.seed,
                       vocab_size=model.vocab_size, model=cfg.model.name)
