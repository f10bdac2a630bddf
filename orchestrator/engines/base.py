"""What every engine adapter provides: the server command line for one trial."""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.sglang_compat import SGLangTarget, args_to_argv, build_args, check_args
from orchestrator.engines.sglang_compat.command import FIRST_NODE, HOST, NodePlace, decode_log_interval

__all__ = ["FIRST_NODE", "HOST", "Engine", "NodePlace", "decode_log_interval", "sglang_flags"]


def sglang_flags(cfg: ParasweepConf, port: int, target: SGLangTarget | None = None,
                 node: NodePlace = FIRST_NODE) -> list[str]:
    """SGLang launch flags for this trial (on ``node`` of a trial across nodes), spelt for
    ``target``'s version and checked against its flag set (a one-line ConfigError names the key
    otherwise). Without a target: SGLang 0.5.23's spellings, unchecked (the simulated engine, which
    reports unknown flags itself when it starts)."""
    if target is None:
        return args_to_argv(build_args(cfg, port, node=node))
    args = build_args(cfg, port, target.version, target.flags, node)
    return args_to_argv(check_args(args, target.flags, target.version))


class Engine:
    """An engine adapter: how to start the server for one trial."""

    name = "engine"

    def python(self, cfg: ParasweepConf) -> str:
        return cfg.engine.python or sys.executable

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path, node: NodePlace = FIRST_NODE) -> list[str]:
        """The command that starts the server (on ``node`` of a trial across nodes)."""
        raise NotImplementedError

    def prepare(self, cfg: ParasweepConf, trial_dir: Path) -> None:
        """Write any files the command line refers to, under ``files_dir`` (called before launch, not on
        dry runs; a trial across nodes carries them to its other nodes)."""

    @staticmethod
    def files_dir(trial_dir: Path) -> Path:
        return trial_dir / "engine"

    def plan_notes(self, cfg: ParasweepConf) -> list[str]:
        """Lines for the dry-run plan about what the command line was built and checked against."""
        return []

    def version(self, cfg: ParasweepConf) -> str:
        """What identifies this engine's behaviour, for matching trials on resume."""
        return "unknown"

    def preflight(self, cfg: ParasweepConf) -> list[str]:
        """Build (and so check) the command line without launching anything; raises a one-line
        UserError/ConfigError where the engine would refuse it. Returns the plan notes."""
        self.argv(cfg, 0, Path("/nonexistent-trial-dir"))
        return self.plan_notes(cfg)


def engine_version(info: dict) -> str:
    """``sglang 0.5.23`` or ``parasweep-sim 0.1.0``: the engine tag and version /server_info gives."""
    version = info.get("version", "unknown")
    return f"{info['engine']} {version}" if info.get("engine") else str(version)
