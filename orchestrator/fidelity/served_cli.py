"""``python -m orchestrator fidelity --silicon [CSV]``: the served rows replayed, printed measured /
parasweep / AIConfigurator, the rows not replayed counted per reason, and the median errors side by side
per family, per GPU and overall; then the disaggregated rows the same way, per model x GPU group."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.fidelity.served import METRICS, Served, Side, median_abs, predict_all, side_by_side
from orchestrator.fidelity.silicon import (
    NO_PROFILE,
    UNMODELLED,
    SiliconRow,
    default_csv,
    read_silicon,
    select,
)
from orchestrator.fidelity.silicon_disagg import read_disagg
from orchestrator.fidelity.silicon_vllm import UNMODELLED as VLLM_UNMODELLED
from vocab.model import ENGINE_NAMES

ARCHITECTURES_NOT_MODELLED = {why for _, why in (*UNMODELLED, *VLLM_UNMODELLED)}


def _ms(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else (f"{x:,.0f}" if x >= 100 else f"{x:.3g}")


def _pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:+.0f}%"


def row_table(served: Sequence[Served]) -> str:
    lines = [f"{'row':46} {'C':>4} {'isl/osl':>9}  {'TTFT ms: measured':>17} {'parasweep':>15} "
             f"{'AIConfigurator':>15}  {'TPOT ms: measured':>17} {'parasweep':>15} {'AIConfigurator':>15}"]
    for s in served:
        cells = [f"{s.id[:46]:46} {s.concurrency:>4} {s.isl // 1000}k/{s.osl // 1000 or s.osl}".ljust(62)]
        for m in METRICS:
            p, a = s.parasweep.get(m), s.aiconfigurator.get(m)
            cells.append(f"{_ms(s.measured[m]):>17} {_ms(p):>8} {_pct(s.error('parasweep', m)):>6} "
                         f"{_ms(a):>8} {_pct(s.error('aiconfigurator', m)):>6}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


def side_table(sides: Sequence[Side], what: str) -> str:
    lines = [f"{what:42} {'metric':6} {'rows':>5} {'parasweep':>10}   {'rows both':>9} {'parasweep':>10} "
             f"{'AIConfigurator':>14}"]
    for s in sides:
        lines.append(f"{s.label[:42]:42} {s.metric.removesuffix('_ms').upper():6} {s.rows:>5} "
                     f"{100 * s.parasweep:>9.1f}%   {s.both:>9} {100 * s.parasweep_on_both:>9.1f}% "
                     f"{100 * s.aiconfigurator_on_both:>13.1f}%")
    return "\n".join(lines)


def request_table(served: Sequence[Served]) -> str:
    """Median |error| of the mean request time (``Served.request_error``: the closed loop's throughput) per
    model x GPU group and overall, parasweep beside AIConfigurator on the rows both estimate."""
    groups: dict[str, list[Served]] = {}
    for s in served:
        if not s.apart:
            groups.setdefault(s.group, []).append(s)
    groups["all"] = [s for s in served if not s.apart]
    lines = [f"{'mean request time (throughput)':42} {'rows':>5} {'parasweep':>10}   {'rows both':>9} "
             f"{'parasweep':>10} {'AIConfigurator':>14}"]
    for label, rs in groups.items():
        both = [s for s in rs if s.request_error("aiconfigurator") is not None]
        cells = [median_abs([s.request_error("parasweep") for s in rs]),
                 median_abs([s.request_error("parasweep") for s in both]),
                 median_abs([s.request_error("aiconfigurator") for s in both])]
        lines.append(f"{label[:42]:42} {len(rs):>5} {100 * cells[0]:>9.1f}%   {len(both):>9} "
                     f"{100 * cells[1]:>9.1f}% {100 * cells[2]:>13.1f}%")
    lines.append("(TTFT + (mean output - 1) x TPOT: C streams over it is the deployment's throughput; a "
                 "saturated server's TTFT multiplies a small error in its capacity, this does not)")
    return "\n".join(lines)


def run_silicon(path: str | None, only: list[str], workers: int | None, with_aic: bool,
                json_out: str | None, backend: str = "sglang") -> int:
    try:
        file = Path(path) if path else default_csv()
        rows, cleaning = read_silicon(file, backend)
        disagg, disagg_cleaning = read_disagg(file, backend)
    except UserError as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    rows, disagg = select(rows, only), select(disagg, only)
    if not rows and not disagg:
        print(f"fidelity: --only {' '.join(only)}: no row of {file} matches", file=sys.stderr)
        return 2
    engine = ENGINE_NAMES[backend]
    print(f"fidelity: replaying {len(rows) + len(disagg)} served {engine} run(s) of {file} on the simulated "
          f"engine{' playing vLLM' if backend == 'vllm' else ''} (predictions in virtual time, not "
          "measurements)"
          + ("; AIConfigurator's estimate of each from the installed aiconfigurator-core"
             if with_aic else ""), flush=True)
    out: dict[str, object] = {"source": str(file), "backend": backend}
    if rows:
        out |= _section(rows, cleaning.lines(), "aggregated", workers, with_aic)
    if disagg and disagg_cleaning is not None:
        if rows:
            print()
        print("Disaggregated runs (prefill and decode servers apart; each role launched as its recipe says, "
              f"{engine}'s defaults where none is published)")
        out["disaggregated"] = _section(disagg, disagg_cleaning.lines(), "disaggregated", workers, with_aic)
        print("(no constant of the simulated engine was chosen on a disaggregated row: each error above is "
              "out of sample)")
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"written: {json_out}")
    return 0


def _section(rows: Sequence[SiliconRow], cleaning: list[str], kind: str, workers: int | None,
             with_aic: bool) -> dict[str, object]:
    """One kind of row replayed and printed: the cleaning, the rows, what was not replayed, the medians per
    family and per GPU (per model x GPU group for the disaggregated rows); the JSON of it returned."""
    for line in cleaning:
        print(f"  cleaning: {line}")

    def progress(done: int, total: int) -> None:
        if done % 25 == 0 or done == total:
            print(f"  {done}/{total} {kind} rows", file=sys.stderr, flush=True)

    served, skipped = predict_all(rows, workers, with_aic, progress)
    print(row_table(served))
    print("(mean TTFT and mean per-request TPOT over the measured requests; "
          "error = predicted / measured - 1)")
    for reason, n in Counter(s["reason"] for s in skipped).most_common():
        print(f"not replayed: {n} row(s): {reason}")
    aic_none = Counter(s.aic_why_none for s in served if s.aic_why_none)
    for reason, n in aic_none.most_common():
        print(f"no AIConfigurator estimate: {n} row(s): {reason}")
    total = len(served) + len(skipped)
    modelled = total - sum(1 for s in skipped if s["reason"] in ARCHITECTURES_NOT_MODELLED)
    profiled = modelled - sum(1 for s in skipped if NO_PROFILE in s["reason"])
    print(f"predicted {len(served)} of {total} distinct {kind} row(s); of the {modelled} whose "
          f"architecture the simulated engine models, {100 * len(served) / max(modelled, 1):.0f} %; of the "
          f"{profiled} of those on a GPU with a hardware profile, "
          f"{100 * len(served) / max(profiled, 1):.0f} %")
    print()
    families = side_by_side(served, lambda s: s.family)
    second, label = ((side_by_side(served, lambda s: s.group), "model x GPU group") if kind == "disaggregated"
                     else (side_by_side(served, lambda s: s.system), "GPU"))
    print(side_table(families, "family (model, layout, precision, GPU)"))
    print()
    print(side_table(second, label))
    print("(median |error|; 'rows both': the rows AIConfigurator estimates too, both medians over them)")
    if kind == "disaggregated":
        print(request_table(served))
    return {"cleaning": cleaning, "compared": [s.as_json() for s in served], "skipped": skipped,
            "summary": {"family": [s.__dict__ for s in families],
                        "group" if kind == "disaggregated" else "gpu": [s.__dict__ for s in second]}}
