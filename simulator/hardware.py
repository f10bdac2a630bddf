"""Load a hardware profile (``conf/hardware/<name>.yaml``) into the orchestrator's ``HardwareConf``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import yaml

# The repository root is the parent of the ``simulator`` package; profiles live under it.
REPO_ROOT = Path(__file__).resolve().parent.parent
HARDWARE_DIR = REPO_ROOT / "conf" / "hardware"

if str(REPO_ROOT) not in sys.path:  # the orchestrator package lives next to us; cwd may be anywhere
    sys.path.append(str(REPO_ROOT))

from orchestrator.config.hardware import HardwareConf  # noqa: E402  (needs the path above)


class HardwareError(ValueError):
    pass


def resolve_hardware_path(name_or_path: str) -> Path:
    """A bare name is looked up in conf/hardware/; anything ending in .yaml/.yml/.json is a path."""
    if name_or_path.endswith((".yaml", ".yml", ".json")):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise HardwareError(f"hardware profile file not found: {path}")
        return path
    path = HARDWARE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))
        raise HardwareError(f"unknown hardware profile {name_or_path!r}; known: {', '.join(known)}")
    return path


def load_hardware(name_or_path: str) -> HardwareConf:
    path = resolve_hardware_path(name_or_path)
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: expected a mapping of HardwareConf fields")
    known = {f.name for f in dataclasses.fields(HardwareConf)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise HardwareError(f"{path}: unknown HardwareConf fields: {', '.join(unknown)}")
    hw = HardwareConf(**data)
    for field in ("memory_gb", "mem_bw_gbs", "peak_tflops_bf16", "power_limit_w", "link_bw_gbs"):
        if float(getattr(hw, field)) <= 0:
            raise HardwareError(f"{path}: {field} must be > 0")
    if hw.interconnect not in ("pcie", "nvlink"):
        raise HardwareError(f"{path}: interconnect must be 'pcie' or 'nvlink', got {hw.interconnect!r}")
    if hw.num_gpus < 1:
        raise HardwareError(f"{path}: num_gpus must be >= 1")
    return hw
