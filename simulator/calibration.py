"""Calibration profiles: fitted values of the cost model's constants, each with where it came from.

A profile calibrates one hardware profile. It overrides fields of :class:`simulator.costs.CostParams`
(efficiencies, kernel floor, host costs) and of the hardware profile (all-reduce latency, launch costs,
...) and carries the fit's residuals. The file (YAML) looks like::

    name: h100-sxm-x8-vidur
    hardware: h100-sxm-x8                # the hardware profile it calibrates
    source: what was fitted to, and how (one paragraph)
    params:                              # CostParams fields
      eta_mem: {value: 0.81, source: "fit to ... (n points, residual ...)"}
    hardware_overrides:                  # HardwareConf fields
      allreduce_latency_us: {value: 9.8, source: "..."}
    spec_acceptance:                     # speculative decoding: a measured per-position acceptance
      eagle3: {value: 0.71, source: "accept length 2.9 at 5 steps, measured over ..."}
    fit: {...}                           # residuals and held-out errors, free-form

It is read by the simulated engine (``--sim-calibration PATH``; the orchestrator's config group
``calibration`` writes one per trial) and written by ``python -m orchestrator calibrate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator.costs import CostParams
from vocab.hardware import HardwareConf


class CalibrationError(ValueError):
    """A calibration profile that cannot be used; the message is one line."""


@dataclass
class Calibration:
    name: str
    hardware: str
    source: str = ""
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # {field: {value, source}}
    hardware_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # draft kind (eagle3, eagle, mtp, standalone, ngram) -> {value: per-position acceptance, source}: what a
    # measured run accepted, used where the acceptance is left to ``auto``
    spec_acceptance: dict[str, dict[str, Any]] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def apply(self, params: CostParams, hw: HardwareConf) -> tuple[CostParams, HardwareConf]:
        """``params`` and ``hw`` with this profile's values in place."""
        return (dataclasses.replace(params, **{k: v["value"] for k, v in self.params.items()}),
                dataclasses.replace(hw, **{k: v["value"] for k, v in self.hardware_overrides.items()}))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check(entries: Any, known: set[str], what: str, where: str) -> dict[str, dict[str, Any]]:
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise CalibrationError(f"{where}: {what} must be a mapping of field: {{value, source}}")
    out = {}
    for key, entry in entries.items():
        if key not in known:
            raise CalibrationError(
                f"{where}: unknown {what} field {key!r}; known: {', '.join(sorted(known))}")
        if not isinstance(entry, dict) or "value" not in entry:
            raise CalibrationError(f"{where}: {what}.{key} must be {{value: <number>, source: <text>}}")
        if not isinstance(entry["value"], int | float) or isinstance(entry["value"], bool):
            raise CalibrationError(f"{where}: {what}.{key}.value must be a number, got {entry['value']!r}")
        out[key] = {"value": float(entry["value"]), "source": str(entry.get("source", ""))}
    return out


PARAM_FIELDS = {f.name for f in dataclasses.fields(CostParams)}
DRAFT_KINDS = {"eagle3", "eagle", "mtp", "standalone", "ngram"}
HARDWARE_FIELDS = {f.name for f in dataclasses.fields(HardwareConf)
                   if f.type in ("float", float)}  # numbers only: names and text are not fitted


def calibration_from_dict(data: Any, where: str = "calibration") -> Calibration:
    if not isinstance(data, dict) or not data.get("name") or not data.get("hardware"):
        raise CalibrationError(f"{where}: expected a mapping with at least 'name' and 'hardware'")
    return Calibration(
        name=str(data["name"]), hardware=str(data["hardware"]), source=str(data.get("source", "")),
        params=_check(data.get("params"), PARAM_FIELDS, "params", where),
        hardware_overrides=_check(data.get("hardware_overrides"), HARDWARE_FIELDS, "hardware_overrides",
                                  where),
        spec_acceptance=_rates(_check(data.get("spec_acceptance"), DRAFT_KINDS, "spec_acceptance", where),
                               where),
        fit=dict(data.get("fit") or {}))


def _rates(entries: dict[str, dict[str, Any]], where: str) -> dict[str, dict[str, Any]]:
    for kind, entry in entries.items():
        if not 0.0 <= entry["value"] <= 1.0:
            raise CalibrationError(f"{where}: spec_acceptance.{kind}.value is a per-position acceptance in "
                                   f"[0, 1], got {entry['value']}")
    return entries


def load_calibration(path: str | Path) -> Calibration:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CalibrationError(f"calibration profile not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CalibrationError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from exc
    return calibration_from_dict(data, str(path))


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cal.to_dict(), sort_keys=False, width=100))
    return path
