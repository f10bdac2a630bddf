"""Served runs of the silicon CSV predicted twice, by parasweep's simulated engine and by AIConfigurator,
and the two held against the measurement on the same rows.

parasweep replays a row the way it was measured (``silicon.to_entry``: its launch flags, its client's
closed loop, lengths and seed) and takes the client's own mean TTFT and mean per-request TPOT from the
replayed records. AIConfigurator's estimate is computed in the same run with the installed
aiconfigurator-core, called as its own accuracy tool calls it (``aic.estimate_agg``): the CSV's layout
columns as given, nominal lengths, its default prefill budget. Neither number is a measurement.
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.silicon import COLD, SLOWER, SiliconRow, Unreplayable, to_entry
from orchestrator.fidelity.silicon_disagg import DisaggRow
from orchestrator.fidelity.silicon_disagg import to_entry as disagg_entry
from orchestrator.fidelity.silicon_vllm import to_vllm_disagg_entry, to_vllm_entry

METRICS = ("ttft_ms", "tpot_ms")


@dataclass
class Served:
    """One row: measured, parasweep's prediction and AIConfigurator's estimate (None where it gives
    none, with why)."""

    id: str
    family: str
    group: str
    system: str
    kind: str  # the trust bands' family: dense, moe, pp, router
    layout: str  # TP, or EP where experts are spread
    hardware: str  # parasweep's hardware profile
    cohort: str
    concurrency: int
    isl: int
    osl: int
    measured: dict[str, float]
    parasweep: dict[str, float]
    aiconfigurator: dict[str, float | None]
    aic_why_none: str = ""
    apart: str = ""  # why the row is scored apart from the others, "" where it is not (silicon.apart_reason)
    mean_output: float = 0.0  # the client's mean output length (tokens)
    notes: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    def error(self, who: str, metric: str) -> float | None:
        """Signed relative error of ``who``'s number (predicted / measured - 1)."""
        pred = getattr(self, who).get(metric)
        return None if pred is None else pred / self.measured[metric] - 1.0

    def request_error(self, who: str) -> float | None:
        """Signed relative error of ``who``'s mean request time, TTFT + (mean output - 1) x TPOT: in a closed
        loop of C streams the throughput is C over it, so this is the deployment's throughput error (with
        the sign turned). Unlike the TTFT of a saturated deployment, it does not grow without bound as the
        load nears a server's capacity."""
        pred = getattr(self, who)
        if pred.get("ttft_ms") is None or pred.get("tpot_ms") is None:
            return None

        def time(x: dict) -> float:
            return x["ttft_ms"] + (self.mean_output - 1) * x["tpot_ms"]

        return time(pred) / time(self.measured) - 1.0

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        out["error"] = {who: {m: None if (e := self.error(who, m)) is None else round(e, 4) for m in METRICS}
                        for who in ("parasweep", "aiconfigurator")}
        return out


def predict_row(row: SiliconRow, with_aic: bool = True, params: dict[str, float] | None = None
                ) -> tuple[str, object]:
    """("ok", Served) or ("skip", reason), for a worker process. ``params``: cost-model constants in place
    of the defaults (a candidate term's value, benchmarks/fidelity_terms.py)."""
    from orchestrator.fidelity.replay import predict

    try:
        if isinstance(row, DisaggRow):
            entry, notes = to_vllm_disagg_entry(row) if row.backend == "vllm" else disagg_entry(row)
        else:
            entry, notes = to_vllm_entry(row) if row.backend == "vllm" else to_entry(row)
        with tempfile.TemporaryDirectory(prefix="parasweep-terms-") as tmp:
            if params:
                entry.parasweep["calibration"] = str(calibration_file(Path(tmp), entry.parasweep["hardware"],
                                                                  params))
            plan, predicted = predict(entry)
    except (Unreplayable, NotModelled) as e:
        return "skip", str(e)
    except (ValueError, RuntimeError) as e:
        return "skip", f"the replay failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    # output lengths uniform in [ratio x L, L] (fixed where the client gives no ratio)
    ratio = 1.0 if entry.workload.random_range_ratio is None else entry.workload.random_range_ratio
    aic: dict[str, float | None] = {"ttft_ms": None, "tpot_ms": None}
    why = "not asked (--no-aiconfigurator)"
    if with_aic:
        # the core logs a warning per estimate it makes with BF16 attention tables where the checkpoint
        # implies FP8 (docs/fidelity.md says so once); a row's own refusal comes back as its reason
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        est = aic_estimate(row)
        aic = {"ttft_ms": est.ttft_ms, "tpot_ms": est.tpot_ms}
        why = est.why_none
    return "ok", Served(
        id=row.id, family=row.family, group=row.group, system=row.system, kind=plan.family,
        # the GPU's profile, not the profile of the nodes a disaggregated deployment spans
        layout=plan.layout, hardware=entry.parasweep.get("hardware", plan.hardware), cohort=row.cohort,
        concurrency=row.concurrency, isl=row.isl, osl=row.osl,
        measured={"ttft_ms": row.ttft_ms, "tpot_ms": row.tpot_ms},
        parasweep={"ttft_ms": predicted["mean_ttft_ms"], "tpot_ms": predicted["mean_tpot_ms"]},
        aiconfigurator=aic, aic_why_none=why if aic["ttft_ms"] is None else "", apart=row.apart,
        mean_output=row.osl * (1 + ratio) / 2,
        notes=[*notes, *plan.notes], duplicates=row.duplicates)


def aic_estimate(row: SiliconRow):  # -> aic.AicEstimate
    """AIConfigurator's estimate of ``row`` from its cells as they stand (the estimator leaves an empty one
    out, as AIConfigurator's accuracy tool does)."""
    from orchestrator.fidelity.aic import RoleCells, estimate_agg, estimate_disagg

    c = row.columns
    if isinstance(row, DisaggRow):
        def cells(role: str) -> RoleCells:
            return RoleCells(*(c[f"{role}_{k}"] for k in ("batch_size", "tp_size", "pp_size",
                                                          "attention_dp_size", "moe_tp_size", "moe_ep_size")))

        return estimate_disagg(row.model, row.system, row.isl, row.osl, cells("prefill"), cells("decode"),
                               c["gemm_quant_mode"], c["moe_quant_mode"], row.version or None, row.backend)
    return estimate_agg(row.model, row.system, row.isl, row.osl, c["batch_size"], c["tp_size"], c["pp_size"],
                        c["attention_dp_size"], c["moe_tp_size"], c["moe_ep_size"], c["gemm_quant_mode"],
                        c["moe_quant_mode"], row.version or None, row.backend)


def calibration_file(folder: Path, hardware: str, params: dict[str, float]) -> Path:
    """A calibration profile holding ``params`` (the simulated engine's way to take constants)."""
    path = folder / "terms.yaml"
    path.write_text(yaml.safe_dump({"name": "terms", "hardware": hardware, "source": "candidate terms",
                                    "params": {k: {"value": float(v), "source": "candidate"}
                                               for k, v in params.items()}}))
    return path


def _with_aic(row: SiliconRow) -> tuple[str, object]:
    return predict_row(row, True)


def _without_aic(row: SiliconRow) -> tuple[str, object]:
    return predict_row(row, False)


def predict_all(rows: Sequence[SiliconRow], workers: int | None = None, with_aic: bool = True,
                progress: Callable[[int, int], None] | None = None
                ) -> tuple[list[Served], list[dict[str, str]]]:
    """(predicted rows, skipped rows with their reasons), on ``workers`` processes."""
    fn = _with_aic if with_aic else _without_aic
    results: list[tuple[str, object]] = []
    if workers == 1:
        for i, r in enumerate(rows):
            results.append(fn(r))
            if progress:
                progress(i + 1, len(rows))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, res in enumerate(pool.map(fn, rows, chunksize=4)):
                results.append(res)
                if progress:
                    progress(i + 1, len(rows))
    served: list[Served] = []
    skipped: list[dict[str, str]] = []
    for row, (kind, value) in zip(rows, results, strict=True):
        if kind == "ok":
            served.append(value)
        else:
            skipped.append({"id": row.id, "reason": str(value)})
    return served, skipped


@dataclass(frozen=True)
class Side:
    """Median |error| of one metric over some rows, for parasweep and for AIConfigurator on the rows where
    both have a number."""

    label: str
    metric: str
    rows: int  # rows parasweep predicted
    parasweep: float
    both: int  # rows both predicted
    parasweep_on_both: float
    aiconfigurator_on_both: float


def median_abs(values: Sequence[float | None]) -> float:
    xs = [abs(v) for v in values if v is not None]
    return statistics.median(xs) if xs else math.nan


APART = {COLD: "measured without warm-up (apart)", SLOWER: "slower than on a lesser GPU (apart)"}


def apart_label(s: Served) -> str:
    """The line a row scored apart is counted on: one per kind of reason (silicon's reasons begin with
    their kind)."""
    return next(label for kind, label in APART.items() if s.apart.startswith(kind))


def side_by_side(served: Sequence[Served], key: Callable[[Served], str]) -> list[Side]:
    """One line per group of ``key`` and metric over the rows that judge the model, one for all of those,
    and one per kind of reason for the rows scored apart (silicon.apart_reason: their measurements hold
    what no replay of a warm server on their GPU predicts)."""
    scored = [s for s in served if not s.apart]
    groups: dict[str, list[Served]] = {}
    for s in scored:
        groups.setdefault(key(s), []).append(s)
    groups["all"] = scored
    for s in served:
        if s.apart:
            groups.setdefault(apart_label(s), []).append(s)
    order = {"all": 1, **{label: 2 for label in APART.values()}}
    out: list[Side] = []
    for label, rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0], 0), kv[0])):
        for m in METRICS:
            both = [s for s in rs if s.aiconfigurator.get(m) is not None]
            out.append(Side(label, m, len(rs), median_abs([s.error("parasweep", m) for s in rs]), len(both),
                            median_abs([s.error("parasweep", m) for s in both]),
                            median_abs([s.error("aiconfigurator", m) for s in both])))
    return out
