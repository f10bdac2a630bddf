"""vLLM (``vllm serve``) on the GPUs a trial is given: its command line, built from the shared keys and
checked against the vLLM release it will run (the one ``engine.python`` has installed, else
``vllm.release`` or the newest recorded), so a flag that release lacks is refused before anything
launches. On GPUs the trial runs ``engine.python -m vllm.entrypoints.cli.main serve``; where there are
none the simulated engine plays it (``sim_vllm.py``; docs/vllm-adapter.md)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from packaging.version import InvalidVersion, Version

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import FIRST_NODE, Engine, NodePlace
from orchestrator.engines.vllm_compat.command import vllm_argv
from orchestrator.engines.vllm_compat.readout import VLLMReadout
from orchestrator.engines.vllm_compat.speculative import SYNTHETIC_SINCE
from orchestrator.engines.vllm_compat.versions import NEWEST_KNOWN, RECORDED
from orchestrator.errors import ConfigError


@functools.cache
def installed_version(python: str) -> str | None:
    """The vLLM release ``python`` has installed (its package metadata; vLLM itself is not imported)."""
    try:
        proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                              capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def target_release(installed: str | None, asked: str | None = None) -> tuple[str, str]:
    """(the recorded release a command line is checked against, why that one): the installed one, else
    ``asked`` (``vllm.release``), else the newest recorded."""
    if asked is not None and asked not in RECORDED:
        raise ConfigError("vllm.release", asked, ", ".join(RECORDED) + " or null",
                          why="the recorded vLLM releases")
    if installed is None and asked is not None:
        return asked, f"vLLM not installed here: checked against {asked} (vllm.release)"
    if installed is None:
        return NEWEST_KNOWN, f"vLLM not installed here: checked against the newest recorded, {NEWEST_KNOWN}"
    if installed in RECORDED:
        return installed, f"vLLM {installed} installed (its recorded flags)"
    try:
        older = [v for v in RECORDED if Version(v) <= Version(installed)]
    except InvalidVersion:  # a build without a release number (a nightly's "0.1.dev..." is valid)
        older = []
    chosen = older[-1] if older else RECORDED[0]
    return chosen, f"vLLM {installed} installed, not recorded: checked against the nearest recorded, {chosen}"


class VLLMEngine(VLLMReadout, Engine):
    name = "vllm"

    def target(self, cfg: ParasweepConf) -> tuple[str, str]:
        return target_release(installed_version(self.python(cfg)), cfg.vllm.release)

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path, node: NodePlace = FIRST_NODE) -> list[str]:
        return vllm_argv(cfg, self.python(cfg), port, self.target(cfg)[0], node)

    def preflight(self, cfg: ParasweepConf) -> list[str]:
        python = self.python(cfg)
        if not cfg.dry_run and installed_version(python) is None:
            raise ConfigError("engine.python", python,
                              'a Python with vLLM installed (pip install -e ".[vllm]")',
                              why="vLLM is not installed there; dry_run=true prints the command without it")
        return super().preflight(cfg)

    def plan_notes(self, cfg: ParasweepConf) -> list[str]:
        version, why = self.target(cfg)
        notes = [why]
        s = cfg.spec
        if (s.algorithm not in ("none", "ngram") and (s.draft_load_format or cfg.model.load_format) == "dummy"
                and Version(version) < SYNTHETIC_SINCE):
            notes.append(f"vLLM {version} accepts a dummy-weight draft's tokens almost never (its synthetic "
                         f"acceptance comes with {SYNTHETIC_SINCE}): the measured speculation is at an "
                         "accept length near 1")
        return notes

    def version(self, cfg: ParasweepConf) -> str:
        return f"vllm {self.target(cfg)[0]}"
