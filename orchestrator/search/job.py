"""``python run.py search=<name>``, start to end: every candidate judged in prediction (``runner.py``),
one MLflow run for the whole search (a sweep run of mode ``search``: the table of every candidate, the
Pareto fronts and the answer as artifacts), the best ``search.measure_top`` measured as its child trials
(``measure.py``), and the answer by measured numbers beside the prediction.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.diagnose import overrides_text
from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError
from orchestrator.search.evaluate import OK, OVER_SLO, PRUNED, REJECTED, Settings, check_settings, goodput
from orchestrator.search.measure import (
    Measured,
    candidate_label,
    judge,
    judged_points,
    live_refusal,
    loads_around,
    measured_rows,
    rank_agreement,
    run_trial_process,
    trial_argv,
    trial_points,
)
from orchestrator.search.runner import (
    PREDICTED,
    SearchResult,
    command_lines,
    run_search,
    search_base,
    slo_text,
)
from vocab.metric_keys import point_metrics
from vocab.status import Tag
from vocab.status import simulated as is_simulated

ANSWER_FILE = "answer.md"  # in the search folder: the answer, also the search run's description


def run_search_job(raw_cfg: Any) -> dict[str, Any]:
    """The Hydra task's body for ``search=<name>``: a single run, its output directory the job's."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from orchestrator.config.validate import typed_config

    cfg = typed_config(raw_cfg)
    hc = HydraConfig.get()
    if hc.mode != RunMode.RUN:
        raise ConfigError("search", cfg.search.name, "a single run (python run.py search=NAME)",
                          why="a search spans its own candidates: drop -m")
    if cfg.search.measure_top < 0:
        raise ConfigError("search.measure_top", cfg.search.measure_top, "an integer >= 0 (0: predict only)")
    out_dir = Path(hc.runtime.output_dir).resolve()
    settings = check_settings(cfg)
    result = run_search(cfg, out_dir, keep=max(cfg.search.measure_top, 1),
                        overrides=tuple(hc.overrides.task))
    answer = result.folder / ANSWER_FILE
    _write_answer(answer, result.answer)  # now: a search stopped while measuring keeps its answer so far
    run_id = _search_run(cfg, result, settings)
    if cfg.search.measure_top and run_id:
        top = result.ranked[:cfg.search.measure_top]
        print(f"[parasweep] measuring the best {len(top)} predicted, each at its predicted best load and one "
              "step either side, as trials of the search's run", flush=True)
        measured = [_measure(cfg, settings, o, rank, run_id, list(hc.overrides.task), out_dir)
                    for rank, o in enumerate(top, 1)]
        lines = measured_lines(cfg, measured, settings, run_id, tuple(hc.overrides.task))
        _log_measured(cfg, run_id, measured, settings, result.folder)
        for line in lines:
            print(line, flush=True)
        _write_answer(answer, [*result.answer, *lines])
        _tracker(cfg).log_artifact(run_id, answer, "search")
    return {"status": "ok", "run_id": run_id, "timings": {}}


def _write_answer(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(["```", *lines, "```", ""]))


def _tracker(cfg: ParasweepConf) -> Any:
    from orchestrator.store.tracking import Tracker

    return Tracker(cfg.tracking.uri, cfg.tracking.experiment)


def _search_run(cfg: ParasweepConf, result: SearchResult, settings: Settings) -> str | None:
    """The search's MLflow run (created now, closed by ``run.py`` at its end), with the table, the
    Pareto fronts and the counts; None when nothing tracks (a dry run)."""
    from analysis.search_plots import pareto_plots
    from orchestrator import sweep

    if sweep.ACTIVE is None:
        return None
    sweep.ACTIVE.mode = "search"
    run_id = sweep.ensure_started()
    if run_id is None:
        return None
    tracker = _tracker(cfg)
    s = cfg.search
    tracker.set_tags(run_id, {Tag.SEARCH: s.name or "", Tag.SEARCH_SOURCE: PREDICTED})
    tracker.log_params(run_id, {"search.name": s.name, "search.space": "; ".join(s.space),
                                "search.objective": s.objective, "search.slo": slo_text(settings) or "none",
                                "search.max_concurrency": s.max_concurrency,
                                "search.measure_top": s.measure_top})
    counts = {status: sum(1 for o in result.outcomes if o.status == status)
              for status in (OK, OVER_SLO, PRUNED, REJECTED)}
    metrics = [(f"search/{k.replace(' ', '_')}", float(v), 0) for k, v in counts.items()]
    metrics += [("search/candidates", float(len(result.outcomes)), 0),
                ("search/load_points_predicted", float(sum(o.predictions for o in result.outcomes)), 0)]
    if result.ranked:
        metrics.append(("search/best_predicted_score", float(result.ranked[0].score or 0.0), 0))
    tracker.log_metrics(run_id, metrics)
    keys = [d for d in result.table.columns if d in {k.split("=", 1)[0].lstrip("+") for k in s.space}]
    plots = pareto_plots(result.table, keys, result.folder, f"search {s.name}: each candidate at its "
                         "highest load within the SLOs", PREDICTED)
    for path in [result.folder / "candidates.parquet", result.folder / "candidates.csv",
                 result.folder / ANSWER_FILE, *plots]:
        tracker.log_artifact(run_id, path, "search")
    return run_id


def _measure(cfg: ParasweepConf, settings: Settings, outcome: Any, rank: int, run_id: str,
             task: list[str], out_dir: Path) -> Measured:
    """One candidate measured as a child trial of the search run."""
    from orchestrator.prediction.modelled import apply_change, point_predictor

    cap = outcome.max_load or settings.max_concurrency
    m = Measured(outcome, rank, loads_around(outcome.concurrency or 1, cap))
    label = candidate_label(rank, outcome.change)
    run_dir = out_dir / "measured" / str(rank)
    why = live_refusal(search_base(cfg), outcome.change)
    if why:
        m.status = f"not measured: it cannot run as a trial here ({why})"
        print(f"[parasweep] not measuring #{rank} {overrides_text(outcome.change)}: {why}", flush=True)
        return m
    print(f"[parasweep] measuring #{rank} {overrides_text(outcome.change)} at concurrency "
          f"{', '.join(map(str, m.loads))}", flush=True)
    run_trial_process(trial_argv(task, outcome.change, m.loads, run_id, label, run_dir))
    runs = [r for r in _tracker(cfg).children(run_id) if r.data.tags.get(Tag.OVERRIDES) == label]
    if not runs:
        m.status = "no run (the trial did not start: its output above says why)"
        return m
    run = max(runs, key=lambda r: r.info.start_time)
    m.run_id, m.status = run.info.run_id, run.data.tags.get(Tag.STATUS, "?")
    m.engine = run.data.tags.get(Tag.ENGINE, "?")
    m.measured = {p.concurrency: v for p, v in point_metrics(run.data.metrics).items() if p.concurrency}
    predict = point_predictor(*apply_change(cfg, outcome.change))
    m.predicted = {c: predict(point).metrics for c, point in trial_points(m.loads, predict).items()}
    good = ({} if settings.objective == "output_tok_s_per_gpu"
            else _measured_goodput(run_dir, m.loads, settings))
    judge(m, settings, outcome.gpus, good)
    return m


def _measured_goodput(run_dir: Path, loads: list[int], settings: Settings) -> dict[int, float]:
    """Goodput per load from the trial's own request records (the trial logs no per-request SLO)."""
    from vocab.records import read_records

    path = run_dir / "records" / "requests.jsonl"
    if not path.is_file():
        return {}
    records = list(read_records(path))
    out = {}
    for c in loads:
        mine = [r for r in records if r.point == f"c{c}"]
        if mine:
            out[c] = goodput(mine, judged_points(loads)[c], settings.slo)
    return out


def measured_lines(cfg: ParasweepConf, measured: list[Measured], settings: Settings,
                   run_id: str, task: tuple[str, ...] = ()) -> list[str]:
    """Predicted against measured for each candidate, the winner by measured numbers, whether the
    ranking held, and the calibration offer."""
    if all(m.status.startswith("not measured") for m in measured):
        return [*(f"  #{m.rank} {overrides_text(m.outcome.change)} [{m.status}]" for m in measured),
                "None of the best can run as a trial on this machine: the prediction's answer stands "
                "unmeasured."]
    engines = {m.engine for m in measured if m.run_id}
    simulated = all(is_simulated(e) for e in engines)
    kind = ("on the simulated engine in real time (a stand-in, not a GPU)" if simulated
            else f"on {', '.join(sorted(engines))}")
    lines = [f"Measured {kind}; beside each number, the search's prediction of the same load point:"]
    for m in measured:
        head = f"  #{m.rank} {overrides_text(m.outcome.change)} [{m.status}]"
        if m.status.startswith("not measured"):
            lines.append(head)
            continue
        if m.score is None:
            lines.append(f"{head}: no load within the SLOs measured (tried {m.loads})")
            continue
        c = m.concurrency or 0
        pred = m.predicted.get(c, {})
        pred_score = _score(pred.get("output_tok_s"), m.outcome.gpus) if settings.objective == \
            "output_tok_s_per_gpu" else None
        parts = [f"best load measured {c} (predicted {m.outcome.concurrency})",
                 f"{settings.objective} measured {m.score:,.1f}"
                 + (f", predicted {pred_score:,.1f} at the same point ({_pct(m.score, pred_score)})"
                    if pred_score is not None else "")]
        for metric in ("output_tok_s", *settings.slo):
            got = m.measured.get(c, {}).get(metric)
            if got is not None:
                parts.append(f"{metric} {_num(got)} measured, {_num(pred.get(metric))} predicted")
        lines.append(f"{head}: " + "; ".join(parts))
    scored = sorted((m for m in measured if m.score is not None), key=lambda m: -(m.score or 0.0))
    if scored:
        win = scored[0]
        unmeasured = [f"#{m.rank}" for m in measured if m.status.startswith("not measured")]
        head = ("Winner by measured numbers" if not unmeasured else
                f"Best of those measured ({', '.join(unmeasured)} could not run here)")
        lines.append(f"{head}: #{win.rank} {overrides_text(win.outcome.change)} at "
                     f"concurrency {win.concurrency}: {settings.objective} {win.score:,.1f}")
        lines += command_lines(cfg, win.outcome.change, win.concurrency, task)
    else:
        lines.append("No measured candidate met the SLOs at the loads tried: the prediction's best stands "
                     "unconfirmed (the SLOs may sit at the model's edge, or the model is off here).")
    tau = rank_agreement(measured)
    held = "n/a (fewer than two measured within the SLOs)" if tau is None else (
        f"{tau:.2f} ({'the ranking held' if tau == 1.0 else 'the ranking changed'})")
    lines.append(f"Rank agreement (Kendall's tau, predicted against measured order): {held}")
    if cfg.calibration.name:
        lines.append(f"Predictions used calibration profile {cfg.calibration.name}.")
    lines.append(f"To fit the simulator to these measured trials and search again with it: python -m "
                 f"orchestrator calibrate --run {run_id} --name <NAME>, then the same search with "
                 f"calibration=<NAME>")
    return lines


def _pct(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return "n/a"
    return f"measured {100.0 * (measured / predicted - 1.0):+.0f}%"


def _score(tok_s: float | None, gpus: int) -> float | None:
    return None if tok_s is None or not math.isfinite(tok_s) else tok_s / max(1, gpus)


def _num(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.1f}"


def _log_measured(cfg: ParasweepConf, run_id: str, measured: list[Measured], settings: Settings,
                  folder: Path) -> None:
    table = pd.DataFrame(measured_rows(measured, settings))
    path = folder / "measured.csv"
    table.to_csv(path, index=False)
    tracker = _tracker(cfg)
    tracker.log_artifact(run_id, path, "search")
    metrics = [(f"search/measured_score_rank{m.rank}", float(m.score), 0)
               for m in measured if m.score is not None]
    tau = rank_agreement(measured)
    if tau is not None:
        metrics.append(("search/rank_agreement", tau, 0))
    tracker.log_metrics(run_id, metrics)
