"""Real SGLang (``python -m sglang.launch_server``) on the GPUs Ray assigned to the trial."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import Engine, sglang_flags


class SGLangEngine(Engine):
    name = "sglang"

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path) -> list[str]:
        return [self.python(cfg), "-m", "sglang.launch_server", *sglang_flags(cfg, port)]
