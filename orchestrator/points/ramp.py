"""How long a closed-loop point's streams take to enter (``workload.ramp=auto``): the point's mean
request duration, predicted by the simulator's model in virtual time.

A closed loop whose streams all start at once, with fixed lengths, prefills, decodes and finishes in
waves for ever; entering the streams one by one over about one request's duration spreads them out.
The duration comes from the same model ``predict=true`` runs: the mean E2E of one wave of C requests
sent at once to a fresh engine (:func:`duration_probe`), a few milliseconds of CPU per point. It is a
scale, not a measurement: a real engine's requests may run longer or shorter, which only makes the
entries denser or sparser. A trial's load plan and the search ramp their points by the same probe, so
a search's predicted point and the trial that measures it are the same requests sent the same way.
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


def duration_probe(point: Any) -> Any:
    """What a closed-loop point's ramp is scaled by: one wave of its C requests, sent at once."""
    assert point.concurrency is not None
    return dataclasses.replace(point, num_requests=point.concurrency, warmup_requests=0, ramp_s=0.0,
                               ci_target=None, duration_s=None)


def probe_duration(result: Any) -> float:
    """The probe's mean E2E in seconds (0: no request finished: no ramp)."""
    e2e_ms = result.metrics.get("e2e_mean_ms", float("nan"))
    return e2e_ms / 1000.0 if e2e_ms == e2e_ms and e2e_ms > 0 else 0.0


def ramped(point: Any, predict: Callable[[Any], Any]) -> Any:
    """``point`` with its streams ramped in over the predicted duration (``predict``: one point on a
    fresh engine, in virtual time)."""
    return dataclasses.replace(point, ramp_s=probe_duration(predict(duration_probe(point))))


def predicted_durations(cfg: ParasweepConf, points: list[Any], spec_of: Callable[[ParasweepConf], Any]
                        ) -> dict[str, float]:
    """Point label -> predicted request duration in seconds ({} where the model cannot predict the
    config). ``spec_of`` gives the config's request spec (asked inside: it reads the model)."""
    from orchestrator.engines.virtual import virtual_trials

    try:
        with tempfile.TemporaryDirectory(prefix="parasweep-ramp-") as tmp:
            fresh = virtual_trials(cfg, Path(tmp))
            spec = spec_of(cfg)
            return {p.label: probe_duration(fresh().run_point(duration_probe(p), spec)) for p in points}
    except Exception as exc:  # a layout the model cannot run: no ramp rather than no trial
        log.info("workload.ramp=auto: no predicted request duration (%s); the streams start at once",
                 (str(exc) or repr(exc)).splitlines()[0])
        return {}
