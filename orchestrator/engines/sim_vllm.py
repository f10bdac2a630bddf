"""The simulated engine playing vLLM (``python -m simulator serve MODEL <vLLM flags> --sim-*``): the
same ``vllm serve`` flags the real vLLM gets, checked against the release it plays (``vllm.release``,
else the newest recorded), then the simulator's own. Read back as a vLLM server is (``readout.py``)."""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import FIRST_NODE, NodePlace
from orchestrator.engines.drafts import acceptance_flag
from orchestrator.engines.launch_args import args_to_argv
from orchestrator.engines.sim import SimEngine, fault_flags, simulator_fingerprint
from orchestrator.engines.vllm import target_release
from orchestrator.engines.vllm_compat.command import build_args, check_args
from orchestrator.engines.vllm_compat.readout import VLLMReadout
from orchestrator.engines.vllm_compat.versions import release
from orchestrator.errors import ConfigError
from orchestrator.redact import redact_mapping, redact_text, secret_values
from vocab.assets import model_dir


def _setting_of(cfg: ParasweepConf, message: str) -> tuple[str, Any]:
    """The config key and value behind the first of ``message``'s flags that parasweep sets (else
    ``server.extra_args``, where every other flag comes from)."""
    version = played_release(cfg)
    by_flag = {a.flag: a for a in build_args(cfg, 30000, FIRST_NODE, version) if a.key}
    for flag in re.findall(r"--[a-z0-9][a-z0-9-]*", message):
        if flag in by_flag:
            return by_flag[flag].key, by_flag[flag].value
    return "server.extra_args", redact_mapping(dict(cfg.server.extra_args))


def played_release(cfg: ParasweepConf) -> str:
    """The vLLM release the simulated engine plays: ``vllm.release``, else the newest recorded (vLLM need
    not be installed to be played)."""
    return target_release(None, cfg.vllm.release)[0]


class SimVLLMEngine(VLLMReadout, SimEngine):
    name = "sim-vllm"

    def version(self, cfg: ParasweepConf) -> str:
        return f"parasweep-sim {simulator_fingerprint()} playing vllm {played_release(cfg)}"

    def plan_notes(self, cfg: ParasweepConf) -> list[str]:
        return [
            f"the simulated engine plays vLLM {played_release(cfg)} (its flags checked against that release)"
        ]

    def preflight(self, cfg: ParasweepConf) -> list[str]:
        """The command line through the simulator's vLLM parser, so a flag it does not know (from
        server.extra_args), or a setting or combination it does not model, stops the sweep before
        anything launches."""
        self.parse_flags(cfg)
        self._check_modelled(cfg)
        return self.plan_notes(cfg)

    def _check_modelled(self, cfg: ParasweepConf) -> None:
        """The simulator's translation of the flags (what a trial's engine does as it starts): what it
        refuses as not modelled is a one-line ConfigError on the key that set the flag named first,
        not a trial that fails at its start. What it refuses for the hardware's sake (the memory a
        layout needs) is left to the trial, as the real engine's start-up would be."""
        from simulator.vllm.cli import VLLMFlagError, parse

        with tempfile.TemporaryDirectory(prefix="parasweep-preflight-") as tmp:
            try:
                parse(self.prepared_flags(cfg, Path(tmp)), exit_on_error=False)
            except VLLMFlagError as e:
                key, value = _setting_of(cfg, str(e))
                secrets = secret_values(dict(cfg.server.extra_args))
                raise ConfigError(key, redact_text(str(value), secrets),
                                  "a setting the simulated engine playing vLLM models",
                                  why=redact_text(str(e), secrets)) from None

    def flag_parser(self) -> tuple[argparse.ArgumentParser, str]:
        from simulator.vllm.cli import build_vllm_parser

        return build_vllm_parser(), "python -m simulator serve --help"

    def simulator_flags(
        self, cfg: ParasweepConf, port: int, trial_dir: Path, node: NodePlace = FIRST_NODE
    ) -> list[str]:
        version = played_release(cfg)
        flags = args_to_argv(check_args(build_args(cfg, port, node, version), release(version)))
        model = str(model_dir(cfg.model.path))
        if "--hf-overrides" in flags:  # the simulator reads a config.json with the overrides applied
            i = flags.index("--hf-overrides")
            del flags[i : i + 2]
            model = str(self.model_copy(trial_dir))
        if cfg.calibration.name:
            flags += ["--sim-calibration", str(self.calibration_file(trial_dir))]
        return [
            "serve",
            model,
            *flags,
            "--sim-vllm-release",
            version,
            "--sim-hardware",
            str(self.hardware_file(trial_dir)),
            "--sim-step-costs",
            cfg.simulator.step_costs,
            "--sim-time-scale",
            f"{cfg.engine.time_scale:g}",
            *(["--sim-spec-acceptance", acceptance_flag(cfg)] if cfg.spec.algorithm != "none" else []),
            *fault_flags(cfg.engine.sim_faults),
            *(["--sim-pd-node", str(cfg.pd.node)] if cfg.pd.role and cfg.pd.node else []),
        ]
