"""What makes two trials "the same": the resolved config minus keys that do not change what is
measured. Used for the ``parasweep.config_hash`` tag and to resume sweeps."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from orchestrator.config.schema import ParasweepConf

# top-level groups, or dotted keys, that do not change the measurement
HASH_EXCLUDE = ("tracking", "report", "ray", "search", "dry_run", "predict", "resume", "reproduce", "repeats",
                "engine.startup_timeout_s", "engine.stop_grace_s", "engine.python", "model.weights")


def resolved_config_dict(cfg: ParasweepConf, engine: str) -> dict[str, Any]:
    data = asdict(cfg)
    data["engine"]["name"] = engine  # record what "auto" became
    return data


def config_hash(resolved: dict[str, Any], engine_version: str = "") -> str:
    """Same hash = same measurement: the resolved config (less what does not change results), the
    engine's version (SGLang release, or the simulator's source) and the GPU type Ray was told."""
    measured = json.loads(json.dumps(resolved, default=str))
    measured["_engine_version"] = engine_version
    measured["_accelerator_type"] = (resolved.get("ray") or {}).get("accelerator_type")
    for key in HASH_EXCLUDE:
        parent, _, leaf = key.rpartition(".")
        node = measured.get(parent, {}) if parent else measured
        node.pop(leaf, None)
    return hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()[:16]
