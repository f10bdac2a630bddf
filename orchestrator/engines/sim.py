"""The built-in simulated engine (``python -m simulator``): SGLang's flags plus ``--sim-*`` flags."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import Engine, sglang_flags


class SimEngine(Engine):
    name = "sim"

    @staticmethod
    def hardware_file(trial_dir: Path) -> Path:
        # the resolved profile, so command-line overrides of hardware.* reach the simulator too
        return trial_dir / "engine" / "hardware.yaml"

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path) -> list[str]:
        return [self.python(cfg), "-m", "simulator", *sglang_flags(cfg, port),
                "--sim-hardware", str(self.hardware_file(trial_dir)),
                "--sim-time-scale", f"{cfg.engine.time_scale:g}"]

    def prepare(self, cfg: ParasweepConf, trial_dir: Path) -> None:
        from dataclasses import asdict

        path = self.hardware_file(trial_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(asdict(cfg.hardware), sort_keys=False))
