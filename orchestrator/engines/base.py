"""What every engine adapter provides: the server command line for one trial."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.sglang_compat import SGLangTarget, args_to_argv, build_args, check_args
from orchestrator.engines.sglang_compat.command import FIRST_NODE, HOST, NodePlace, decode_log_interval

if TYPE_CHECKING:
    import pandas as pd

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
    """An engine adapter: how to start the server for one trial, and how to read it while it runs. The
    reading side is SGLang's here (``/server_info``, its startup log, ``/flush_cache``, a log line per
    batch); vLLM's adapters read vLLM's (``vllm_compat/readout.py``)."""

    name = "engine"
    # the log has a line per batch (SGLang's): it is the scheduler series' first source; a periodic
    # stats line (vLLM's, every 10 s) only stands in where /metrics has nothing
    batch_log = True

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

    def launch_env(self) -> dict[str, str]:
        """Environment the server is started with beside the trial's (batch lines stamped to the ms)."""
        return {"SGLANG_LOG_MS": "1"}

    def server_info(self, url: str) -> dict[str, Any]:
        """What the ready server says of itself (SGLang: ``GET /server_info``)."""
        from orchestrator.process.server import http_get_json

        return http_get_json(url + "/server_info")

    def resolved(self, info: dict[str, Any], log_text: str) -> dict[str, Any]:
        """The values the engine resolved at start-up: ``server_info`` completed by the startup log."""
        from orchestrator.telemetry.server_log import resolved_config

        return resolved_config(info, log_text)

    def flush_cache(self, url: str) -> bool:
        """Empty the server's prefix cache before a point; False where it would not."""
        from orchestrator.process.server import flush_prefix_cache

        return flush_prefix_cache(url)

    def log_frame(self, path: Path) -> pd.DataFrame:
        """The server log's scheduler lines, one row each (``telemetry/server_log.py``'s columns)."""
        from orchestrator.telemetry.server_log import server_log_frame

        return server_log_frame(path)

    def preflight(self, cfg: ParasweepConf) -> list[str]:
        """Build (and so check) the command line without launching anything; raises a one-line
        UserError/ConfigError where the engine would refuse it. Returns the plan notes."""
        self.argv(cfg, 0, Path("/nonexistent-trial-dir"))
        return self.plan_notes(cfg)

