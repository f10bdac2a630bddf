"""A server's launch flags as parasweep builds them, whatever the engine: each flag with its values and the
config key it came from, so an engine adapter can refuse a flag its release lacks against the key the
user can change, in one line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Arg:
    """One flag with its values and the config key that produced it (for error messages)."""

    flag: str
    values: list[str] = field(default_factory=list)
    key: str = ""
    value: Any = None  # the config value, as the user wrote it
    optional: bool = False  # a default value: dropped, not refused, where the version lacks the flag


def plain_value(value: Any) -> Any:
    """OmegaConf containers -> plain dict/list, so they print as JSON."""
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [plain_value(v) for v in value]
    return value


def flag_values(value: Any) -> list[str]:
    """A config value as a flag's arguments: a mapping as one JSON argument, a list one argument per item."""
    value = plain_value(value)
    if isinstance(value, dict):
        return [json.dumps(value, separators=(",", ":"), sort_keys=True)]
    if isinstance(value, list):
        return [json.dumps(v) if isinstance(v, dict) else str(v) for v in value]
    return [str(value)]


def args_to_argv(args: list[Arg]) -> list[str]:
    return [x for a in args for x in (a.flag, *a.values)]
