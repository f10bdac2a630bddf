"""A search space, written in Hydra's sweep syntax and read with Hydra's own override parser, and the
candidates it spans: one change of the base config (``{"tp.size": 4, "pp.size": 2}``) per combination.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import ConfigError

SYNTAX = ("entries KEY=VALUES in Hydra's sweep syntax, e.g. tp.size=choice(1,2,4,8), "
          "pp.async_depth=range(0,17,4)")


@dataclass(frozen=True)
class Dimension:
    key: str  # a config key (an engine flag as server.extra_args.<flag>)
    values: tuple[Any, ...]


def parse_space(entries: Sequence[str]) -> list[Dimension]:
    """The dimensions of ``search.space``; a ``ConfigError`` naming the entry for anything else."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if not entries:
        raise ConfigError("search.space", "[]", SYNTAX, why="the space is empty: nothing to search")
    parser = OverridesParser.create()
    dims: dict[str, Dimension] = {}
    for entry in entries:
        try:
            override = parser.parse_override(str(entry))
        except HydraException as exc:
            raise ConfigError("search.space", entry, SYNTAX, why=str(exc).splitlines()[0]) from None
        if override.is_delete() or override.value_type is None:
            raise ConfigError("search.space", entry, SYNTAX)
        key = override.key_or_group
        try:
            values = (tuple(override.sweep_iterator()) if override.is_sweep_override()
                      else (override.value(),))
        except HydraException as exc:  # interval(): continuous, nothing to enumerate
            raise ConfigError("search.space", entry, SYNTAX, why=str(exc).splitlines()[0]) from None
        if not values:
            raise ConfigError("search.space", entry, SYNTAX, why=f"{key} has no values")
        if key in dims:
            raise ConfigError("search.space", entry, "each key once", why=f"{key} is given twice")
        dims[key] = Dimension(key, values)
    return list(dims.values())


def with_group_keys(dims: list[Dimension], overrides: Sequence[str]) -> list[Dimension]:
    """``dims`` and, for each config group the space chooses an option of (``pd=choice(...)``), the
    command line's keys inside that group (``pd.transfer_backend=nixl``) as one-valued dimensions: an
    option replaces the whole group, and Hydra applies such keys after it, so every candidate carries
    them. Keys the space already searches are left to it."""
    groups = {d.key for d in dims if "." not in d.key}
    have = {d.key for d in dims}
    inside = [o.lstrip("+") for o in overrides
              if not o.startswith("~") and o.lstrip("+").split("=", 1)[0].split(".", 1)[0] in groups
              and "." in o.split("=", 1)[0] and o.lstrip("+").split("=", 1)[0] not in have]
    return dims + parse_space(inside) if inside else dims


def candidates(dims: Sequence[Dimension]) -> Iterator[dict[str, Any]]:
    """Every combination of the dimensions' values, in order."""
    for values in itertools.product(*(d.values for d in dims)):
        yield {d.key: v for d, v in zip(dims, values, strict=True)}


def size(dims: Sequence[Dimension]) -> int:
    n = 1
    for d in dims:
        n *= len(d.values)
    return n
