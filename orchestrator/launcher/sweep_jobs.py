"""A sweep as the launcher sees it before anything starts: every job composed, validated and
preflighted once (:class:`CheckedJob`), and the settings that belong to the sweep as a whole
(:class:`SweepSettings`), which no trial may change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.config.schema import SWEEP_WIDE_KEYS, ParasweepConf
from orchestrator.errors import ConfigError
from orchestrator.store.tracking import tracking_uri


@dataclass
class CheckedJob:
    """One Hydra job of the sweep after validation."""

    index: int  # the Hydra job number (trial #)
    job_config: Any  # Hydra's composed config for the job (what the trial task receives)
    cfg: ParasweepConf  # the same, typed
    engine: str  # the concrete engine validation chose (sim or sglang)
    overrides: tuple[str, ...]
    label: str = ""  # what varies between the sweep's trials
    config_hash: str = ""
    engine_reason: str = ""  # why that engine (the driver decides engine=auto on its node)


def _value(cfg: ParasweepConf, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


@dataclass(frozen=True)
class SweepSettings:
    tracking_uri: str
    experiment: str
    ray_address: str | None
    ray_num_gpus: int | None
    ray_num_cpus: int | None
    resume: bool
    dry_run: bool
    predict: bool

    @classmethod
    def of(cls, cfgs: list[ParasweepConf]) -> SweepSettings:
        """The sweep's settings; a sweep-wide key that differs between trials is a one-line error."""
        for key in SWEEP_WIDE_KEYS:
            values = sorted({str(_value(c, key)) for c in cfgs})
            if len(values) > 1:
                raise ConfigError(key, ",".join(values), "one value for the whole sweep",
                                  why="it configures the sweep, not a trial, so it cannot vary")
        first = cfgs[0]
        return cls(tracking_uri(first.tracking.uri), first.tracking.experiment, first.ray.address,
                   first.ray.num_gpus, first.ray.num_cpus, first.resume, first.dry_run, first.predict)
