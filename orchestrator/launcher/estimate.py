"""How long each trial will take, from the simulator's model in virtual time, so the queue can start
the largest trials (GPUs x seconds) first. Best effort: no estimate means ordering by GPU count."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from orchestrator.config.schema import ParasweepConf

log = logging.getLogger("parasweep")

ENGINE_START_S = 2.0  # rough fixed cost per trial on top of the load (start, logging, teardown)


def estimate_durations(cfgs: list[ParasweepConf], scratch: Path,
                       budget_s: float = 10.0) -> list[float] | None:
    """Predicted seconds per trial, or None if any trial could not be predicted within the budget."""
    from orchestrator.engines.sim import SimEngine
    from orchestrator.trial import load_points, request_spec

    try:
        from simulator.predict import predict_trial
    except ImportError:
        return None
    deadline = time.monotonic() + budget_s
    out = []
    for i, cfg in enumerate(cfgs):
        if time.monotonic() > deadline:
            log.info("trial duration estimates skipped: over the %.0f s budget", budget_s)
            return None
        try:
            sim = SimEngine()
            trial_dir = scratch / f"estimate-{i}"
            sim.prepare(cfg, trial_dir)
            argv = sim.argv(cfg, 30000, trial_dir)[3:]
            results = predict_trial(argv, load_points(cfg), request_spec(cfg))
        except Exception as exc:  # e.g. a layout the simulator cannot model: order by GPUs instead
            log.info("no duration estimate for trial %d: %s", i, (str(exc) or repr(exc)).splitlines()[0])
            return None
        virtual = sum(r.metrics.get("duration_s", 0.0) for r in results)
        out.append(virtual / max(cfg.engine.time_scale, 1e-9) + ENGINE_START_S)
    return out
