"""What every engine adapter provides: the server command line for one trial."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ParasweepConf
from orchestrator.paths import model_dir

HOST = "127.0.0.1"  # servers are never exposed beyond this machine by default


def decode_log_interval(cfg: ParasweepConf) -> int:
    """SGLang's decode log samples every Nth processed slot; with N a multiple of the PP loop size
    every line shows the same micro-batch. Pick the smallest N >= 40 coprime with the loop size."""
    if cfg.server.decode_log_interval is not None:
        return cfg.server.decode_log_interval
    loop = cfg.pp.size + cfg.pp.async_depth if cfg.pp.size > 1 else 1
    n = 40
    while math.gcd(n, loop) != 1:
        n += 1
    return n


def _extra_flags(extra: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in extra.items():
        flag = name if name.startswith("--") else "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list | tuple):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def sglang_flags(cfg: ParasweepConf, port: int) -> list[str]:
    """SGLang launch flags for this trial: full flag names only (SGLang accepts unique prefixes, and
    `--pp` is ambiguous since 0.5.7), defaults left to the engine unless the config sets them."""
    flags = [
        "--model-path", str(model_dir(cfg.model.path)),
        "--served-model-name", cfg.model.name,
        "--load-format", cfg.model.load_format,
        "--tp-size", str(cfg.tp.size),
        "--pp-size", str(cfg.pp.size),
        "--ep-size", str(cfg.ep.size),
        "--dp-size", str(cfg.dp.size),
    ]
    if cfg.model.skip_tokenizer_init:
        flags.append("--skip-tokenizer-init")
    if cfg.pp.size > 1:
        flags += ["--pp-async-batch-depth", str(cfg.pp.async_depth)]
    if cfg.pp.micro_batch_size is not None:
        flags += ["--pp-max-micro-batch-size", str(cfg.pp.micro_batch_size)]
    s = cfg.server
    if s.max_running_requests is not None:
        flags += ["--max-running-requests", str(s.max_running_requests)]
    if s.chunked_prefill_size is not None:
        flags += ["--chunked-prefill-size", str(s.chunked_prefill_size)]
    if s.mem_fraction_static is not None:
        flags += ["--mem-fraction-static", str(s.mem_fraction_static)]
    if not s.cuda_graph:
        flags.append("--disable-cuda-graph")
    flags += [
        "--enable-metrics",
        "--decode-log-interval", str(decode_log_interval(cfg)),
        "--random-seed", str(s.random_seed),
        "--host", HOST,
        "--port", str(port),
    ]
    return flags + _extra_flags(s.extra_args)


class Engine:
    """An engine adapter: how to start the server for one trial."""

    name = "engine"

    def python(self, cfg: ParasweepConf) -> str:
        return cfg.engine.python or sys.executable

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path) -> list[str]:
        raise NotImplementedError

    def prepare(self, cfg: ParasweepConf, trial_dir: Path) -> None:
        """Write any files the command line refers to (called before launch, not on dry runs)."""
