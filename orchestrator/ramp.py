"""How long a closed-loop point's streams take to enter (``workload.ramp=auto``): the point's mean
request duration, predicted by the simulator's model in virtual time.

A closed loop whose streams all start at once, with fixed lengths, prefills, decodes and finishes in
waves for ever; entering the streams one by one over about one request's duration spreads them out.
The duration comes from the same model ``predict=true`` runs (a burst start, the point's own requests
and count, no stop rule): a few milliseconds of CPU per point. It is a scale, not a measurement: a
real engine's requests may run longer or shorter, which only makes the entries denser or sparser.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ParasweepConf

log = logging.getLogger("parasweep")


def predicted_durations(cfg: ParasweepConf, points: list[Any], spec_of: Callable[[ParasweepConf], Any]
                        ) -> dict[str, float]:
    """Point label -> predicted mean E2E in seconds ({} where the model cannot predict the config).
    ``spec_of`` gives the config's request spec (asked inside: it reads the model)."""
    from orchestrator.engines.sim import SimEngine
    from simulator.predict import predict_trial

    burst = [dataclasses.replace(p, ramp_s=0.0, ci_target=None, duration_s=None) for p in points]
    try:
        with tempfile.TemporaryDirectory(prefix="parasweep-ramp-") as tmp:
            sim = SimEngine()
            sim.prepare(cfg, Path(tmp))
            results = predict_trial(sim.simulator_flags(cfg, 30000, Path(tmp)), burst, spec_of(cfg))
    except Exception as exc:  # a layout the model cannot run: no ramp rather than no trial
        log.info("workload.ramp=auto: no predicted request duration (%s); the streams start at once",
                 (str(exc) or repr(exc)).splitlines()[0])
        return {}
    out = {}
    for point, result in zip(points, results, strict=True):
        e2e_ms = result.metrics.get("e2e_mean_ms", float("nan"))
        out[point.label] = e2e_ms / 1000.0 if e2e_ms == e2e_ms and e2e_ms > 0 else 0.0
    return out
