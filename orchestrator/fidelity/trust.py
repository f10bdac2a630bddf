"""How far to trust a prediction: the error of the model on published measurements like it.

``data/published/errors.json`` holds, for the current model, every published number the corpus compares
(``benchmarks/fidelity_corpus.py --update`` writes it after a change to the model is accepted). A
configuration belongs to a family: ``pp`` (pipeline stages), ``router`` (DP replicas), ``moe`` or
``dense``; within it to a layout (TP, or EP where experts are spread) and a GPU. Its band is the median
absolute error of the most specific group with at least ``MIN_ENTRIES`` published runs: the family on
that GPU and layout, else the family, else the whole corpus. Every prediction carries the band in words
("±24 % (median) on 12 published dense runs"); a predicted gain smaller than the band is inside what
the model gets wrong about a single configuration, and the diagnosis and "run this instead" say so.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf
from vocab.assets import published_dir

ERRORS_FILE = "errors.json"
MIN_ENTRIES = 3


@dataclass(frozen=True)
class Band:
    error: float  # median |predicted / measured - 1| over the group's compared numbers
    entries: int  # published runs in the group
    group: str  # "dense runs", "moe TP runs on h200-nvlink-x8", "runs"

    @property
    def pct(self) -> float:
        return 100.0 * self.error

    def text(self) -> str:
        return f"±{self.pct:.0f} % (median) on {self.entries} published {self.group}"

    def inside(self, gain_pct: float) -> bool:
        """Whether a predicted change of ``gain_pct`` per cent is within the band."""
        return abs(gain_pct) < self.pct


@functools.cache
def _rows() -> tuple[dict, ...]:
    path = published_dir() / ERRORS_FILE
    if not path.is_file():
        return ()
    return tuple(json.loads(path.read_text())["compared"])


def _band(rows: list[dict], group: str) -> Band | None:
    entries = len({r["id"] for r in rows})
    if entries < MIN_ENTRIES:
        return None
    return Band(statistics.median(abs(r["error"]) for r in rows), entries, group)


def band_for(family: str, layout: str, hardware: str) -> Band | None:
    """The band of the most specific group with enough published runs (module doc); None without the
    errors file."""
    rows = list(_rows())
    if not rows:
        return None
    exact = [r for r in rows if r["family"] == family and r["layout"] == layout and r["hardware"] == hardware]
    same = [r for r in rows if r["family"] == family]
    return (_band(exact, f"{family} {layout} runs on {hardware}") or _band(same, f"{family} runs")
            or _band(rows, "runs"))


def family_of(cfg: ParasweepConf, change: Mapping[str, Any] | None = None) -> tuple[str, str, str]:
    """(family, layout, hardware profile) of a configuration (with ``change``'s layout keys applied), as
    the corpus groups its runs."""
    change = change or {}

    def size(key: str) -> int:
        return int(change.get(f"{key}.size", getattr(cfg, key).size))

    if size("pp") > 1:
        family = "pp"
    elif size("dp") > 1:
        family = "router"
    else:
        family = "moe" if model_info(cfg.model.path).is_moe else "dense"
    return family, "EP" if size("ep") > 1 else "TP", cfg.hardware.name


def band_for_config(cfg: ParasweepConf, change: Mapping[str, Any] | None = None) -> Band | None:
    """The band of ``cfg``; with a ``change``, the wider of the configuration's and the changed one's (a
    predicted difference between two families carries the errors of both)."""
    bands = [b for b in (band_for(*family_of(cfg)), band_for(*family_of(cfg, change)) if change else None)
             if b is not None]
    return max(bands, key=lambda b: b.error) if bands else None
