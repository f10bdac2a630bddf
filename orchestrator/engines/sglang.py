"""Real SGLang (``python -m sglang.launch_server``) on the GPUs Ray assigned to the trial."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import FIRST_NODE, Engine, NodePlace, sglang_flags
from orchestrator.engines.sglang_compat import SGLangTarget, resolve_target


class SGLangEngine(Engine):
    name = "sglang"

    def target(self, cfg: ParasweepConf) -> SGLangTarget:
        """The installed SGLang of ``engine.python`` (probed once per process; flag sets cached per
        version under ~/.cache/parasweep), or the newest recorded version where none is installed."""
        return resolve_target(self.python(cfg))

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path, node: NodePlace = FIRST_NODE) -> list[str]:
        # checked against the target's flag set: a flag it does not know fails here, not on the GPU node
        return [self.python(cfg), "-m", "sglang.launch_server",
                *sglang_flags(cfg, port, self.target(cfg), node)]

    def plan_notes(self, cfg: ParasweepConf) -> list[str]:
        return [self.target(cfg).describe()]

    def version(self, cfg: ParasweepConf) -> str:
        return f"sglang {self.target(cfg).version}"
