"""Each trial predicted by the simulator's model in virtual time before it runs. Used twice: the
queue starts the longest trials first, and every measured trial gets its predicted metrics logged
beside the measured ones (``pred/c8/output_tok_s`` next to ``c8/output_tok_s``). Best effort: a
trial that cannot be predicted in the budget just has no prediction. The budget is this process's CPU
time, not the wall clock: the same sweep gets the same predictions on a busy machine as on a quiet one."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.schema import ParasweepConf
from vocab.load import LoadPoint
from vocab.metric_keys import MetricKey

log = logging.getLogger("parasweep")

ENGINE_START_S = 2.0  # rough fixed cost per trial on top of the load (start, logging, teardown)


@dataclass
class TrialPrediction:
    duration_s: float  # load time on the simulated clock plus a fixed start-up cost
    points: dict[str, dict[str, float]]  # load-point label -> predicted metrics

    def as_metrics(self) -> list[tuple[str, float, int]]:
        return [(str(MetricKey.at(label, key, prefix="pred")), float(value), 0)
                for label, metrics in self.points.items()
                for key, value in metrics.items() if isinstance(value, int | float)]


def predict_trials(cfgs: list[ParasweepConf], scratch: Path,
                   budget_s: float = 10.0) -> list[TrialPrediction | None]:
    from orchestrator.engines.virtual import virtual_trials
    from orchestrator.points.plan import load_points, request_spec
    from orchestrator.points.virtual import in_virtual_time

    try:
        from simulator.predict import run_points
    except ImportError:
        return [None] * len(cfgs)
    deadline = time.process_time() + budget_s
    out: list[TrialPrediction | None] = []
    for i, cfg in enumerate(cfgs):
        if time.process_time() > deadline:
            log.info("trial predictions stopped after the %.0f s (CPU) budget", budget_s)
            out.append(None)
            continue
        try:
            fresh = virtual_trials(cfg, scratch / f"predict-{i}")
            points = load_points(cfg)
            results = run_points(fresh, [in_virtual_time(p, cfg.workload.predicted) for p in points],
                                 request_spec(cfg))
        except Exception as exc:  # e.g. a layout the simulator cannot model
            log.info("no prediction for trial %d: %s", i, (str(exc) or repr(exc)).splitlines()[0])
            out.append(None)
            continue
        # the live trial's length: its own request counts at the predicted request rate (the predicted
        # points ran until their numbers were known, longer than the live ones will)
        virtual = sum(_live_duration(p, r.metrics) for p, r in zip(points, results, strict=True))
        out.append(TrialPrediction(virtual / max(cfg.engine.time_scale, 1e-9) + ENGINE_START_S,
                                   {p.label: dict(r.metrics) for p, r in zip(points, results, strict=True)}))
    return out


def _live_duration(point: LoadPoint, metrics: dict[str, float]) -> float:
    """Seconds ``point`` takes as a live trial runs it, from its prediction's request rate."""
    rate = metrics.get("request_s", 0.0)
    if point.measured_requests is not None and rate and rate > 0:
        return point.total_requests / rate
    return metrics.get("duration_s", 0.0)
