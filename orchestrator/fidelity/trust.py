"""How far to trust a prediction: the error of the model on measurements like it that it did not come from.

Sets of measured numbers, each replayed by ``python -m orchestrator fidelity`` and recorded after a
change to the model is accepted: the published corpus (``data/published/errors.json``, written by
``benchmarks/fidelity_corpus.py --update``: every number it compares), the served SGLang runs of
aiconfigurator-core's silicon sample (``data/published/silicon_errors.json``, ``--silicon --update``: each
row's mean TTFT and mean TPOT), and its served vLLM runs (``silicon_vllm_errors.json``, ``--silicon
--backend vllm --update``), which alone judge a trial of vLLM or of the simulated engine playing it (its
groups are vLLM's runs: the same family, layout and GPU, else the family, else every vLLM run). No
constant of the model was fitted to any of them, so each error is out of sample. A configuration
belongs to a family: ``pp`` (pipeline stages), ``router`` (DP replicas), ``moe`` or ``dense``; within
it to a layout (TP, EP where experts are spread, or attention DP; a prefill/decode deployment is
"disaggregated", with " attention DP" where a role runs ranks) and a GPU. Its band is the
median absolute error of the most specific group with at least ``MIN_ENTRIES`` published runs: the family
on that GPU and layout, else (for a disaggregated deployment, whose TTFT holds the queue at its prefill
servers as no single server's does) the family's disaggregated runs on any GPU, else the family, else
everything. A band is of all numbers, or
of one kind of number (``THROUGHPUT``, ``TTFT``, ``TPOT`` with ITL): the model is wrong by different
amounts about each, so a predicted change of a TTFT is judged against the TTFT band. Every prediction
carries its bands in words ("±24 % (median) on 12 published dense runs; TTFT ±40 % on 9, TPOT/ITL ±10 %
on 9"); a predicted gain smaller than its band is inside what the model gets wrong about a single
configuration, and the diagnosis and "run this instead" say so.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf, plays_vllm
from orchestrator.fidelity.corpus import DISAGGREGATED
from vocab.assets import published_dir

ERRORS_FILE = "errors.json"
SILICON_ERRORS_FILE = "silicon_errors.json"
SILICON_VLLM_ERRORS_FILE = "silicon_vllm_errors.json"
MIN_ENTRIES = 3
# the kinds of number a band can be of (an empty kind: every number)
THROUGHPUT, TTFT, TPOT = "throughput", "TTFT", "TPOT/ITL"
KIND_OF_GOAL = {"throughput": THROUGHPUT, "ttft_p99_ms": TTFT, "itl_p99_ms": TPOT, "tpot_p99_ms": TPOT}


def kind_of(metric: str) -> str:
    """The kind of a compared number, by its name (``mean_ttft_ms``, ``output_throughput``, ...)."""
    if "ttft" in metric:
        return TTFT
    if "tpot" in metric or "itl" in metric:
        return TPOT
    return THROUGHPUT


@dataclass(frozen=True)
class Band:
    error: float  # median |predicted / measured - 1| over the group's compared numbers
    entries: int  # measured runs in the group
    group: str  # "dense runs", "moe TP runs on h200-nvlink-x8", "runs"
    kind: str = ""  # THROUGHPUT, TTFT, TPOT; "" for every number

    @property
    def pct(self) -> float:
        return 100.0 * self.error

    def text(self) -> str:
        what = f"{self.kind} " if self.kind else ""
        return f"{what}±{self.pct:.0f} % (median) on {self.entries} published {self.group}"

    def inside(self, gain_pct: float) -> bool:
        """Whether a predicted change of ``gain_pct`` per cent is within the band."""
        return abs(gain_pct) < self.pct


@functools.cache
def _rows(engine: str = "sglang") -> tuple[dict, ...]:
    """Every recorded error of ``engine``'s runs: for SGLang the corpus's numbers and the silicon rows'
    TTFT and TPOT, for vLLM its silicon rows', in one shape (id, metric, error, family, layout,
    hardware)."""
    out: list[dict] = []
    path = published_dir() / ERRORS_FILE
    if engine == "sglang" and path.is_file():
        out += json.loads(path.read_text())["compared"]
    path = published_dir() / (SILICON_VLLM_ERRORS_FILE if engine == "vllm" else SILICON_ERRORS_FILE)
    if path.is_file():
        recorded = json.loads(path.read_text())
        # rows scored apart (measured without warm-up, slower than on a lesser GPU) hold what no replay
        # of a warm server on their GPU predicts: not an error of the model's
        served = [*recorded["compared"], *recorded.get("disaggregated", [])]
        for r in (r for r in served if not r.get("apart")):
            for metric, error in r["error"]["parasweep"].items():
                if error is not None:
                    out.append({"id": r["id"], "metric": f"mean_{metric}", "error": error,
                                "family": r["kind"], "layout": r["layout"], "hardware": r["hardware"]})
    return tuple(out)


def _band(rows: list[dict], group: str, kind: str) -> Band | None:
    entries = len({r["id"] for r in rows})
    if entries < MIN_ENTRIES:
        return None
    return Band(statistics.median(abs(r["error"]) for r in rows), entries, group, kind)


def band_for(family: str, layout: str, hardware: str, kind: str = "", engine: str = "sglang") -> Band | None:
    """The band of the most specific group with enough published runs of ``engine`` (module doc), of every
    number or of one ``kind``; None without the errors files."""
    rows = [r for r in _rows(engine) if not kind or kind_of(r["metric"]) == kind]
    if not rows:
        return None
    whose = "vLLM " if engine == "vllm" else ""
    exact = [r for r in rows if r["family"] == family and r["layout"] == layout and r["hardware"] == hardware]
    same = [r for r in rows if r["family"] == family]
    apart = None
    if layout.startswith(DISAGGREGATED):
        apart = _band([r for r in same if r["layout"].startswith(DISAGGREGATED)],
                      f"{whose}{family} {DISAGGREGATED} runs", kind)
    return (_band(exact, f"{whose}{family} {layout} runs on {hardware}", kind) or apart
            or _band(same, f"{whose}{family} runs", kind) or _band(rows, f"{whose}runs", kind))


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
    attention = int(change.get("dp.attention", cfg.dp.attention))
    if cfg.pd.enabled:
        ranks = [r.attention or attention for r in (cfg.pd.prefill, cfg.pd.decode)]
        return family, DISAGGREGATED + (" attention DP" if max(ranks) > 1 else ""), cfg.hardware.name
    layout = "attention DP" if attention > 1 else "EP" if size("ep") > 1 else "TP"
    return family, layout, cfg.hardware.name


def band_for_config(cfg: ParasweepConf, change: Mapping[str, Any] | None = None, kind: str = ""
                    ) -> Band | None:
    """The band of ``cfg`` (of every number, or of one ``kind``); with a ``change``, the wider of the
    configuration's and the changed one's (a predicted difference between two families carries the errors
    of both)."""
    engine = "vllm" if plays_vllm(cfg) else "sglang"
    bands = [b for b in (band_for(*family_of(cfg), kind, engine),
                         band_for(*family_of(cfg, change), kind, engine) if change else None)
             if b is not None]
    return max(bands, key=lambda b: b.error) if bands else None


def bands_text(cfg: ParasweepConf) -> str:
    """Every band of ``cfg`` in words: of all numbers, then of TTFT and of TPOT/ITL where known."""
    whole = band_for_config(cfg)
    if whole is None:
        return ""
    kinds = [b for b in (band_for_config(cfg, kind=TTFT), band_for_config(cfg, kind=TPOT)) if b is not None]
    return "; ".join([whole.text(), *(f"{b.kind} ±{b.pct:.0f} % on {b.entries}"
                                      + ("" if b.group == whole.group else f" published {b.group}")
                                      for b in kinds)])
