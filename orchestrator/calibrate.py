"""``python -m orchestrator calibrate``: fit the simulated engine's cost-model constants to measurements
and write a calibration profile (``conf/calibration/<name>.yaml``) that ``calibration=<name>`` uses.

Two kinds of input:

- ``--run RUN_ID``: a parasweep sweep (or one trial) measured on GPUs. Each trial's resolved config is
  predicted again in virtual time with candidate constants, and the constants are fitted (least squares
  on the log of predicted/measured) to its per-point output tok/s, ITL p50, TPOT p50 and TTFT p50. This
  is the main use: run a small real sweep, calibrate, then predict the big one with
  ``predict=true calibration=<name>``.
- ``--tables DIR``: operator-profile tables like Vidur's (per-operator times by token count and TP
  degree, all-reduce times by size), fitted operator by operator (``simulator/fit_tables.py``).

Every fitted number is written with its source, and the fit's residuals are printed and kept in the
profile. A held-out point is never fitted to.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.engines.sglang_compat.speculative import ALGORITHMS
from orchestrator.errors import UserError
from vocab.assets import model_dir
from vocab.status import simulated
from vocab.telemetry import SPEC_ACCEPT_LEN

# The constants a run can tell apart. Where each lives (CostParams or the hardware profile) is the
# calibration profile's own rule: simulator.calibration's field sets.
# Each is fitted within physical bounds: an efficiency is a fraction of a peak; a host cost is some
# microseconds of Python, never zero; a scale on measured kernel times stays within 5x of the tables.
BOUNDS = {
    "eta_mem": (0.05, 1.0), "eta_expert": (0.05, 1.0), "eta_compute": (0.05, 1.0),
    "kernel_floor_us": (0.5, 20.0), "sched_base_us": (50.0, 20000.0), "sched_per_req_us": (0.5, 500.0),
    "prepare_base_us": (20.0, 20000.0), "process_base_us": (20.0, 20000.0),
    "gloo_latency_us": (5.0, 5000.0), "host_op_us": (2.0, 200.0), "allreduce_latency_us": (1.0, 500.0),
    "kernel_launch_us": (1.0, 50.0), "graph_launch_us": (2.0, 500.0), "link_latency_us": (1.0, 500.0),
    "scale_gemm": (0.2, 5.0), "scale_attention": (0.2, 5.0), "scale_moe": (0.2, 5.0),
    "scale_comm": (0.2, 5.0),
}
FITTABLE = tuple(BOUNDS)
# A constant the points cannot tell apart: changing it by 10 % moves no fitted prediction by more than
# this (relative), or moves them only as the constants already kept do (collinear columns).
MIN_SENSITIVITY = 1e-3
MIN_SINGULAR_RATIO = 1e-2


def home(name: str) -> str:
    """``params`` (a CostParams field) or ``hardware_overrides`` (a hardware profile field)."""
    from simulator.calibration import PARAM_FIELDS

    return "params" if name in PARAM_FIELDS else "hardware_overrides"


RUN_METRICS = ("output_tok_s", "itl_p50_ms", "tpot_p50_ms", "ttft_p50_ms")


class CalibrationInputError(UserError):
    """Input the calibration cannot use; one line."""


@dataclass
class TrialData:
    run_id: str
    label: str
    cfg: Any  # ParasweepConf
    measured: dict[str, dict[str, float]]  # point label -> metric -> value
    engine: str = ""  # the run's parasweep.engine tag: sglang (measured), sim or sim-predict (simulated)
    # speculative decoding: point label -> the accept length the engine reported (spec_accept_len_mean)
    accept: dict[str, float] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return simulated(self.engine)


@dataclass
class RunFit:
    names: list[str]
    start: dict[str, float]
    fitted: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)  # per trial, point, metric
    evaluations: int = 0
    # constants asked for that the points cannot identify: kept at their start value, with why
    unidentified: dict[str, str] = field(default_factory=dict)

    def mape(self, key: str) -> float:
        return _mape([r for r in self.rows if r["set"] == "fit"], key)

    @property
    def improved(self) -> bool:
        """Whether the fit beats the start on the fitted points (else its profile is not written)."""
        return self.mape("error_after_pct") < self.mape("error_before_pct")


# -- reading a run --------------------------------------------------------------------------------------
def read_run(run_id: str, uri: str | None) -> list[TrialData]:
    """The trials of a sweep run (or the one trial run) with their resolved configs and metrics."""
    from mlflow.exceptions import MlflowException
    from omegaconf import OmegaConf

    from analysis.store import StoreError, checked_store
    from analysis.store import client as client_for
    from orchestrator.config.validate import typed_config
    from orchestrator.redact import redact_url
    from orchestrator.store.tracking import tracking_uri
    from vocab.metric_keys import point_metrics
    from vocab.status import RunKind, Tag

    store = tracking_uri(uri)
    try:
        # a mistyped sqlite path must not become a new empty store, nor an outage minutes of retries
        checked_store(store)
    except StoreError as exc:
        raise CalibrationInputError(str(exc)) from exc
    client = client_for(store)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise CalibrationInputError(f"--run {run_id}: no such run in {redact_url(store)}") from exc
    if run.data.tags.get(Tag.KIND) == RunKind.SWEEP:
        runs = client.search_runs([run.info.experiment_id], f"tags.`{Tag.PARENT}` = '{run_id}'",
                                  max_results=10000)
    else:
        runs = [run]
    trials = []
    with tempfile.TemporaryDirectory(prefix="parasweep-calibrate-") as tmp:
        for r in runs:
            measured = {str(p): {k: v for k, v in m.items() if k in RUN_METRICS}
                        for p, m in point_metrics(r.data.metrics).items() if not p.open_loop}
            measured = {p: m for p, m in measured.items() if len(m) == len(RUN_METRICS)
                        and all(math.isfinite(v) and v > 0 for v in m.values())}
            if not measured:
                continue
            try:
                path = client.download_artifacts(r.info.run_id, "config/resolved.yaml", tmp)
            except (MlflowException, OSError):
                continue
            cfg = typed_config(OmegaConf.create(yaml.safe_load(Path(path).read_text())))
            if not (model_dir(cfg.model.path) / "config.json").is_file():
                raise CalibrationInputError(
                    f"--run {run_id}: trial {r.info.run_name} ran model {cfg.model.name} ({cfg.model.path}), "
                    "which has no config.json here; add its HF config directory under models/ first")
            accept = {str(p): m[SPEC_ACCEPT_LEN] for p, m in point_metrics(r.data.metrics).items()
                      if str(p) in measured and SPEC_ACCEPT_LEN in m and m[SPEC_ACCEPT_LEN] >= 1}
            trials.append(TrialData(r.info.run_id, r.info.run_name or r.info.run_id, cfg, measured,
                                    r.data.tags.get(Tag.ENGINE, ""), accept))
    if not trials:
        raise CalibrationInputError(
            f"--run {run_id}: no trial with per-point metrics ({', '.join(RUN_METRICS)}) and a recorded "
            "config/resolved.yaml; calibrate from a sweep whose trials ran their load points")
    return trials


# -- fitting --------------------------------------------------------------------------------------------
def _with_constants(cfg: Any, values: dict[str, float], name: str) -> Any:
    """``cfg`` on the simulated engine with ``values`` as its calibration (other entries kept)."""
    import copy

    out = copy.deepcopy(cfg)
    out.calibration.name = name
    out.calibration.hardware = cfg.hardware.name
    for key, value in values.items():
        getattr(out.calibration, home(key))[key] = {"value": float(value), "source": "fit"}
    return out


def predict_trial_points(cfg: Any, labels: list[str], virtual: bool = False) -> dict[str, dict[str, float]]:
    """Each point of ``labels`` predicted as the trial ran it: ``virtual`` when the trial was itself a
    prediction, whose points ran until their numbers were known (``orchestrator.points.virtual``)."""
    from orchestrator.points.plan import load_points
    from orchestrator.points.virtual import in_virtual_time
    from orchestrator.prediction.modelled import predict_at

    points = {p.label: in_virtual_time(p, cfg.workload.predicted) if virtual else p for p in load_points(cfg)}
    return {label: predict_at(cfg, {}, points[label]) for label in labels if label in points}


def default_names(trials: list[TrialData]) -> list[str]:
    """The constants worth trying: the weight-streaming side and per-step host time always; the expert
    path for MoE models; the all-reduce where some trial used TP. Under the roofline these are its
    efficiencies and latency; where measured kernel tables price the steps, a scale per operator family
    (the efficiencies would only touch the few operators the tables miss). Whether the points can tell
    each apart is checked before fitting (``fit_run``)."""
    from orchestrator.config.model_info import model_info
    from orchestrator.prediction.modelled import step_costs_label

    measured = step_costs_label(trials[0].cfg).startswith("measured")
    names = ["scale_gemm" if measured else "eta_mem", "sched_base_us"]
    if any(model_info(t.cfg.model.path).is_moe for t in trials):
        names.append("scale_moe" if measured else "eta_expert")
    if any(t.cfg.tp.size > 1 for t in trials):
        names.append("scale_comm" if measured else "allreduce_latency_us")
    return names


def identifiable(jacobian: Any, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The constants the fitted points can tell apart, from the sensitivity of every fitted prediction
    (columns of ``jacobian``: d log(predicted) / d log(constant)): a column near zero changes nothing; a
    column the kept ones already span changes nothing they cannot. Most sensitive first."""
    import numpy as np

    norms = np.linalg.norm(jacobian, axis=0) / math.sqrt(max(jacobian.shape[0], 1))
    kept: list[int] = []
    why: dict[str, str] = {}
    for i in sorted(range(len(names)), key=lambda j: -norms[j]):
        if norms[i] < MIN_SENSITIVITY:
            why[names[i]] = (f"a 10 % change moves the fitted predictions by {100 * 0.1 * norms[i]:.3f} % "
                             "on average")
            continue
        s = np.linalg.svd(jacobian[:, [*kept, i]], compute_uv=False)
        if s[-1] < MIN_SINGULAR_RATIO * s[0]:
            why[names[i]] = ("its effect on the fitted predictions is that of "
                             f"{', '.join(names[k] for k in kept)} (the points cannot tell them apart)")
            continue
        kept.append(i)
    return [n for n in names if names.index(n) in kept], why


def _current(trials: list[TrialData], name: str) -> float:
    """A constant's value as the trials' first config has it (calibrated, profile, or model default)."""
    from simulator.costs import CostParams

    cfg = trials[0].cfg
    entry = getattr(cfg.calibration, home(name)).get(name)
    if entry:
        return float(entry["value"])
    if home(name) == "params":
        return float(getattr(CostParams(), name))
    return float(getattr(cfg.hardware, name))


def fit_run(trials: list[TrialData], names: list[str], max_evaluations: int = 80,
            holdout: frozenset[str] = frozenset()) -> RunFit:
    """Least squares on log(predicted / measured) over every trial, point and metric, except the
    held-out load points (``holdout``: point labels such as ``c32``), whose errors are only reported."""
    import numpy as np
    from scipy.optimize import least_squares

    unknown = sorted(set(names) - set(FITTABLE))
    if unknown:
        raise CalibrationInputError(f"--params {','.join(unknown)}: not fittable; valid: "
                                    f"{', '.join(sorted(FITTABLE))}")
    start = {n: _current(trials, n) for n in names}
    for n in names:
        low, high = BOUNDS[n]
        start[n] = min(max(start[n], low), high)
    fit = RunFit(names, start, dict(start))

    keys = [(t, label, metric) for t in trials for label in t.measured for metric in RUN_METRICS]
    fitted_on = np.array([label not in holdout for _, label, _ in keys])
    if not fitted_on.any():
        raise CalibrationInputError(f"--holdout {','.join(sorted(holdout))}: leaves no point to fit on")

    def errors(x: np.ndarray) -> np.ndarray:
        """log(predicted/measured) of every (trial, point, metric), held-out points included."""
        values = dict(zip(names, np.exp(x).tolist(), strict=True))
        predicted = {t.run_id: predict_trial_points(_with_constants(t.cfg, values, "fit"), list(t.measured),
                                                    virtual=t.engine == "sim-predict")
                     for t in trials}
        # a prediction of 0 (constants far off) counts as a huge error rather than a math error
        return np.array([math.log(max(predicted[t.run_id][label][metric], 1e-12) / t.measured[label][metric])
                         for t, label, metric in keys])

    def residuals(x: np.ndarray) -> np.ndarray:
        fit.evaluations += 1
        return errors(x)[fitted_on]  # a held-out point never enters the fit

    x0 = np.log(np.array([start[n] for n in names]))
    try:
        before = errors(x0)
    except UserError:
        raise
    except Exception as exc:  # a recorded config the simulator cannot run: say which, in one line
        raise CalibrationInputError(
            f"the recorded trials cannot be predicted: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from exc
    # which constants the fitted points can identify: the sensitivity of every prediction to a 10 %
    # change of each (one round of predictions per constant)
    step = math.log(1.1)
    columns = []
    for i in range(len(names)):
        x = x0.copy()
        x[i] += step
        columns.append((errors(x) - before)[fitted_on] / step)
    kept, fit.unidentified = identifiable(np.array(columns).T, names)
    index = [names.index(n) for n in kept]
    x_fit = x0.copy()
    if index:
        low = np.log([BOUNDS[n][0] for n in kept])
        high = np.log([BOUNDS[n][1] for n in kept])

        def kept_residuals(y: np.ndarray) -> np.ndarray:
            x = x0.copy()
            x[index] = y
            return residuals(x)

        result = least_squares(kept_residuals, x0[index], bounds=(low, high), diff_step=0.02,
                               max_nfev=max_evaluations, x_scale=1.0)
        x_fit[index] = result.x
    fit.fitted = dict(zip(names, np.exp(x_fit).tolist(), strict=True))
    after = errors(x_fit)
    for i, (t, label, metric) in enumerate(keys):
        fit.rows.append({"trial": t.label, "point": label, "metric": metric,
                         "set": "fit" if fitted_on[i] else "held-out", "measured": t.measured[label][metric],
                         "error_before_pct": 100 * math.expm1(before[i]),
                         "error_after_pct": 100 * math.expm1(after[i])})
    return fit


def run_calibration(fit: RunFit, trials: list[TrialData], run_id: str, name: str) -> Any:
    from simulator.calibration import Calibration

    hardware = {t.cfg.hardware.name for t in trials}
    if len(hardware) > 1:
        raise CalibrationInputError(f"--run {run_id}: its trials ran on several hardware profiles "
                                    f"({', '.join(sorted(hardware))}); calibrate one at a time")
    points = sum(len(t.measured) for t in trials)
    fitted_rows = [r for r in fit.rows if r["set"] == "fit"]
    held = [r for r in fit.rows if r["set"] == "held-out"]
    simulated = sum(t.simulated for t in trials)
    source = (f"least squares on log(predicted/measured) of {', '.join(RUN_METRICS)} over {points} "
              f"load point(s) of {len(trials)} trial(s) of run {run_id}"
              + (f"; {simulated} of them ran on the simulated engine: fitted to simulated numbers, not "
                 "measurements" if simulated else ""))
    cal = Calibration(name=name, hardware=hardware.pop(), source=f"fit to parasweep run {run_id}: {source}",
                      fit={"run_id": run_id, "mape_before_pct": _mape(fitted_rows, "error_before_pct"),
                           "mape_after_pct": _mape(fitted_rows, "error_after_pct"),
                           "heldout_mape_before_pct": _mape(held, "error_before_pct"),
                           "heldout_mape_after_pct": _mape(held, "error_after_pct"),
                           "evaluations": fit.evaluations, "rows": fit.rows})
    cal.fit["not_identified"] = dict(fit.unidentified)
    cal.spec_acceptance = measured_acceptance(trials, run_id)
    for key, value in fit.fitted.items():
        if key in fit.unidentified:
            continue  # the points cannot tell it apart: it keeps the value it had
        getattr(cal, home(key))[key] = {
            "value": round(value, 6), "source": f"{source} (start {fit.start[key]:g})"}
    return cal


def measured_acceptance(trials: list[TrialData], run_id: str) -> dict[str, dict[str, Any]]:
    """Per draft kind, the per-position acceptance the run's speculative trials measured: each trial's
    mean accept length over its points, at the draft depth its engine ran (its spec keys, or SGLang's
    own choice for the architecture), as the chain rate that accepts it; the median over trials."""
    import statistics

    from simulator.speculative.acceptance import rate_for_length
    from simulator.speculative.params import auto_params
    from vocab.model import read_config_json

    by_kind: dict[str, list[tuple[float, float, int, int]]] = {}
    for t in trials:
        s = t.cfg.spec
        if s.algorithm in ("none", "ngram") or not t.accept:
            continue
        arch = (read_config_json(model_dir(t.cfg.model.path)).get("architectures") or ["?"])[0]
        steps, _, tokens = auto_params(ALGORITHMS[s.algorithm], arch)
        if s.num_steps is not None:
            steps, tokens = s.num_steps, s.num_draft_tokens or s.num_steps + 1
        depth = max(1, min(steps, tokens - 1))
        length = min(sum(t.accept.values()) / len(t.accept), depth + 1.0)
        by_kind.setdefault(s.algorithm, []).append((rate_for_length(length, depth), length, depth,
                                                    len(t.accept)))
    out = {}
    for kind, rows in by_kind.items():
        what = "; ".join(f"{length:.2f} at {depth} steps over {n} point(s)" for _, length, depth, n in rows)
        simulated = " (on the simulated engine: the simulator's own acceptance, not measured)" if any(
            t.simulated for t in trials if t.cfg.spec.algorithm == kind) else ""
        out[kind] = {"value": round(statistics.median(r for r, *_ in rows), 4),
                     "source": f"accept length {what}, run {run_id}{simulated}"}
    return out


def _mape(rows: list[dict[str, Any]], key: str) -> float:
    return sum(abs(r[key]) for r in rows) / len(rows) if rows else math.nan


def residual_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'trial':<28} {'point':<6} {'set':<8} {'metric':<13} {'measured':>10} "
             f"{'before':>8} {'after':>8}"]
    for r in rows:
        lines.append(f"{r['trial'][:28]:<28} {r['point']:<6} {r['set']:<8} {r['metric']:<13} "
                     f"{r['measured']:>10.2f} {r['error_before_pct']:>+7.1f}% {r['error_after_pct']:>+7.1f}%")
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CalibrationInputError(f"{message} (python -m orchestrator calibrate --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m orchestrator calibrate", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="RUN_ID", help="a measured parasweep sweep (or trial) run id")
    src.add_argument("--tables", metavar="DIR", type=Path, help="operator-profile tables (e.g. data/vidur)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store of --run (default: runs/mlflow.db)")
    p.add_argument("--params", default=None,
                   help=f"constants to fit from --run, comma-separated (default: chosen from the trials; "
                        f"valid: {', '.join(sorted(FITTABLE))})")
    p.add_argument("--hardware", help="--tables: the hardware profile the tables were measured on")
    p.add_argument("--fit", default="", help="--tables: models to fit on, comma-separated")
    p.add_argument("--holdout", default="",
                   help="models (--tables) or load points such as c32 (--run) held out: their errors are "
                        "reported, never fitted to")
    p.add_argument("--name", help="profile name (default: <hardware>-<run id prefix> or <hardware>-tables)")
    p.add_argument("--out", type=Path,
                   help="where to write the profile (default conf/calibration/<name>.yaml)")
    p.add_argument("--max-evaluations", type=int, default=80, help="--run: prediction rounds at most")
    return p


def main(argv: list[str]) -> int:
    from simulator.calibration import save_calibration
    from vocab.assets import conf_dir

    try:
        args = build_parser().parse_args(argv)
        if args.run:
            trials = read_run(args.run, args.tracking_uri)
            if any(t.simulated for t in trials):
                print(f"calibrate: note: {sum(t.simulated for t in trials)} of {len(trials)} trial(s) ran on "
                      "the simulated engine; their numbers are the simulator's, not measurements", flush=True)
            names = [n.strip() for n in args.params.split(",") if n.strip()] if args.params else \
                default_names(trials)
            print(f"calibrate: fitting {', '.join(names)} to {sum(len(t.measured) for t in trials)} point(s) "
                  f"of {len(trials)} trial(s); each round predicts every point in virtual time", flush=True)
            fit = fit_run(trials, names, args.max_evaluations, frozenset(_names(args.holdout)))
            name = args.name or f"{trials[0].cfg.hardware.name}-{args.run[:8]}"
            cal = run_calibration(fit, trials, args.run, name)
            print(residual_table(fit.rows))
            held = (f"; held out: {cal.fit['heldout_mape_before_pct']:.1f}% before, "
                    f"{cal.fit['heldout_mape_after_pct']:.1f}% after" if args.holdout else "")
            for key, why in fit.unidentified.items():
                print(f"calibrate: {key} not fitted, kept at {fit.start[key]:g}: {why}", flush=True)
            print(f"MAPE (fitted points) {cal.fit['mape_before_pct']:.1f}% before, "
                  f"{cal.fit['mape_after_pct']:.1f}% after{held}; "
                  + ", ".join(f"{k} {fit.start[k]:g} -> {v:.4g}" for k, v in fit.fitted.items()
                              if k not in fit.unidentified))
            if not fit.improved:
                print(f"calibrate: the fit is no better than the start on the fitted points (MAPE "
                      f"{cal.fit['mape_before_pct']:.1f}% -> {cal.fit['mape_after_pct']:.1f}%): no profile "
                      "written", file=sys.stderr, flush=True)
                return 1
        else:
            if not args.hardware:
                raise CalibrationInputError("--tables needs --hardware (the profile they were measured on)")
            from simulator.fit_tables import fidelity_markdown, fit_tables

            result = fit_tables(args.tables, args.hardware, _names(args.fit), _names(args.holdout),
                                name=args.name)
            cal = result.calibration
            print(fidelity_markdown(result))
        out = args.out or conf_dir() / "calibration" / f"{cal.name}.yaml"
        save_calibration(cal, out)
        print(f"calibrate: wrote {out}; use it with calibration={cal.name} "
              f"(hardware={cal.hardware})" if out.parent == conf_dir() / "calibration" else
              f"calibrate: wrote {out}")
        return 0
    except (UserError, ValueError) as exc:
        print(f"calibrate: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]
