"""The built-in simulated engine (``python -m simulator``): SGLang's flags plus ``--sim-*`` flags."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import yaml

from orchestrator.config.schema import ParasweepConf, SimFaultConf
from orchestrator.engines.base import FIRST_NODE, Engine, NodePlace, sglang_flags
from orchestrator.engines.drafts import acceptance_flag
from orchestrator.engines.sglang_compat.command import build_args, check_choices
from orchestrator.engines.sglang_compat.versions import NEWEST_KNOWN, recorded_flag_set
from orchestrator.errors import ConfigError
from orchestrator.redact import redact_mapping, redact_text, secret_values
from vocab.assets import model_dir


def _override_args(cfg: ParasweepConf) -> dict:
    from orchestrator.engines.launch_args import plain_value

    return plain_value(getattr(cfg.model, "override_args", None) or {})


def fault_flags(faults: SimFaultConf) -> list[str]:
    """``engine.sim_faults.*`` as the simulator's ``--sim-fault-*`` flags, one per field that differs from
    its default (a switch for a bool, flag and value otherwise); none when no fault is set."""
    flags: list[str] = []
    for f in dataclasses.fields(SimFaultConf):
        value = getattr(faults, f.name)
        if value == f.default:
            continue
        flag = "--sim-fault-" + f.name.replace("_", "-")
        flags += [flag] if isinstance(value, bool) else [flag, repr(value)]
    return flags


@functools.cache
def simulator_fingerprint() -> str:
    """A hash of the simulator's source: its model is code, so a change to it changes results."""
    digest = hashlib.sha256()
    import simulator

    root = Path(simulator.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:12]


class SimEngine(Engine):
    name = "sim"

    def version(self, cfg: ParasweepConf) -> str:
        return f"parasweep-sim {simulator_fingerprint()}"

    def preflight(self, cfg: ParasweepConf) -> list[str]:
        """Parse the command line with the simulator's own parser, so a flag it does not know (e.g.
        from server.extra_args) stops the sweep before anything launches."""
        self.parse_flags(cfg)
        # values the SGLang release the simulated engine follows lists the choices of (--moe-a2a-backend)
        check_choices(build_args(cfg, 30000), recorded_flag_set(NEWEST_KNOWN), NEWEST_KNOWN)
        return self.plan_notes(cfg)

    def flag_parser(self) -> tuple[argparse.ArgumentParser, str]:
        """The simulator's parser of this engine's flags, and the command that shows them."""
        from simulator.cli import build_parser

        return build_parser(), "python -m simulator --help"

    def parse_flags(self, cfg: ParasweepConf) -> None:
        """The trial's simulator flags through ``flag_parser``: a one-line ConfigError on
        ``server.extra_args`` (secrets masked) where it refuses one."""
        parser, shown = self.flag_parser()

        def refuse(message: str) -> None:
            raise ConfigError("server.extra_args", redact_mapping(dict(cfg.server.extra_args)),
                              f"flags the simulated engine accepts ({shown})",
                              why=redact_text(message, secret_values(dict(cfg.server.extra_args))))

        parser.error = refuse  # type: ignore[method-assign]
        flags = self.simulator_flags(cfg, 30000, Path("/nonexistent-trial-dir"))
        parser.parse_args(flags[1:] if flags[:1] == ["serve"] else flags)

    @staticmethod
    def hardware_file(trial_dir: Path) -> Path:
        # the resolved profile, so command-line overrides of hardware.* reach the simulator too
        return Engine.files_dir(trial_dir) / "hardware.yaml"

    @staticmethod
    def calibration_file(trial_dir: Path) -> Path:
        return Engine.files_dir(trial_dir) / "calibration.yaml"

    @staticmethod
    def model_copy(trial_dir: Path) -> Path:
        return Engine.files_dir(trial_dir) / "model"

    def prepared_flags(self, cfg: ParasweepConf, workdir: Path) -> list[str]:
        """The simulator's flags for ``cfg`` with the files they name (hardware, calibration, model
        overrides) written under ``workdir``: what a prediction parses, and a preflight checks. Their port
        is never listened on."""
        self.prepare(cfg, workdir)
        return self.simulator_flags(cfg, 30000, workdir)

    def argv(self, cfg: ParasweepConf, port: int, trial_dir: Path, node: NodePlace = FIRST_NODE) -> list[str]:
        # across nodes, rank 0 models every node; the other ranks join it and stand by (simulator/nodes.py)
        return [self.python(cfg), "-m", "simulator", *self.simulator_flags(cfg, port, trial_dir, node)]

    def simulator_flags(self, cfg: ParasweepConf, port: int, trial_dir: Path,
                        node: NodePlace = FIRST_NODE) -> list[str]:
        """The simulator's command line without the interpreter: what the live server and the
        virtual-time prediction both parse."""
        flags = sglang_flags(cfg, port, node=node)
        if _override_args(cfg):
            # the simulator has no --json-model-override-args: it reads a config.json with the
            # overrides already applied (written by prepare), so it models the same shrunk model
            i = flags.index("--json-model-override-args")
            del flags[i:i + 2]
            flags[flags.index("--model-path") + 1] = str(self.model_copy(trial_dir))
        if cfg.calibration.name:
            flags += ["--sim-calibration", str(self.calibration_file(trial_dir))]
        return [*flags, "--sim-hardware", str(self.hardware_file(trial_dir)),
                "--sim-step-costs", cfg.simulator.step_costs,
                "--sim-time-scale", f"{cfg.engine.time_scale:g}", *fault_flags(cfg.engine.sim_faults),
                *(["--sim-router", cfg.dp.router] if cfg.dp.router != "round_robin" else []),
                *(["--sim-spec-acceptance", acceptance_flag(cfg)] if cfg.spec.algorithm != "none" else []),
                *(["--sim-pd-node", str(cfg.pd.node)] if cfg.pd.role and cfg.pd.node else [])]

    def prepare(self, cfg: ParasweepConf, trial_dir: Path) -> None:
        from dataclasses import asdict

        path = self.hardware_file(trial_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(asdict(cfg.hardware), sort_keys=False))
        if cfg.calibration.name:
            from omegaconf import OmegaConf

            calibration = OmegaConf.to_container(OmegaConf.structured(cfg.calibration), resolve=True)
            self.calibration_file(trial_dir).write_text(yaml.safe_dump(calibration, sort_keys=False))
        override = _override_args(cfg)
        if override:
            config = json.loads((model_dir(cfg.model.path) / "config.json").read_text())
            config.update(override)  # top-level update, as SGLang applies the override JSON
            out = self.model_copy(trial_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(config, indent=1))

