"""Fit the cost model's constants to published operator profiles (Vidur's H100 tables), with held-out
models whose errors are reported but never fitted to.

Vidur (github.com/microsoft/vidur, MIT) publishes GPU kernel times of every operator of a transformer
layer by token count ``n`` and TP degree ``t`` (``compute/<device>/<org>/<model>/mlp.csv``, in ms) and
NCCL all-reduce times by message size and GPU count (``network/<node>/all_reduce.csv``). A trimmed copy
with its provenance lives in the checkout's ``data/vidur/`` (see its README).

What is fitted, and to what:

* ``eta_mem``, ``eta_compute``, ``kernel_floor_us`` (``CostParams``): to the four projections of a layer
  (``attn_pre_proj`` = fused QKV, ``attn_post_proj`` = O, ``mlp_up_proj`` = fused gate+up,
  ``mlp_down_proj``). They are the operators whose bytes and FLOPs the cost model counts (together they
  are exactly ``layer_nonexpert_params / tp``); each is priced as one kernel,
  ``max(weight_bytes / (eta_mem·BW), 2·n·params / (eta_compute·peak), kernel_floor)``, with the numbers
  from the model's ``config.json`` at TP ``t``. Least squares on log time (every point weighs the same
  relative error), fit models only.
* ``allreduce_latency_us`` (hardware override) and ``eta_link``: to the all-reduce table,
  ``alpha + 2(w-1)/w · bytes / (eta_link · link_bw)``, the formula ``CostModel.comm_time`` uses.

The norms, rotary embedding, activation and residual add are not fitted: the cost model counts no bytes
for them (only a kernel each), so they could only bias the efficiencies. The report says how much of a
layer's measured time they take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from simulator.calibration import Calibration
from simulator.costs import CostParams
from simulator.model_spec import ModelSpec, load_model_spec
from vocab.assets import models_dir as shipped_models_dir
from vocab.hardware import HardwareConf, HardwareError, load_hardware
from vocab.model import ModelConfigError

# The checkout's copy; a pip install has no data/ folder, so the caller passes the directory there.
DEFAULT_TABLES_DIR = Path(__file__).resolve().parents[1] / "data" / "vidur"

# Our model directory name -> the model's folder in Vidur's tables.
VIDUR_MODELS = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "internlm-20b": "internlm/internlm-20b",
    "qwen-72b": "Qwen/Qwen-72B",
}
# Our hardware profile -> (Vidur compute device folder, Vidur network folder).
VIDUR_DEVICES = {"h100-sxm-x8": ("h100", "h100_dgx")}

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# Measured, not fitted: the cost model prices these by kernel count only.
OTHER_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
TOKENS, TP = "num_tokens", "num_tensor_parallel_workers"
# Where the tables sit in Vidur's repository; data/vidur/ keeps the layout below it.
VIDUR_PREFIX = "data/profiling/"
ALLREDUCE_TIME = "time_stats.all_reduce.median"


def time_column(op: str) -> str:
    return f"time_stats.{op}.median"


class TableError(ValueError):
    """Operator tables or model names that cannot be used; the message is one line."""


@dataclass(frozen=True)
class OpCost:
    """One kernel as the cost model sees it, per GPU."""

    op: str
    bytes: float  # weights read
    flops: float


@dataclass(frozen=True)
class PointRow:
    model: str
    op: str
    tokens: int
    tp: int
    measured_ms: float
    before_ms: float  # the default constants
    after_ms: float  # the fitted constants
    split: str  # "fit" or "held-out"


@dataclass(frozen=True)
class ErrorRow:
    model: str
    split: str
    points: int
    mape_before: float  # percent
    mape_after: float
    max_before: float
    max_after: float


@dataclass(frozen=True)
class AllReduceRow:
    workers: int
    size_bytes: int
    measured_ms: float
    before_ms: float
    after_ms: float


@dataclass(frozen=True)
class LayerRow:
    """One table row as a whole layer without its attention kernel: the four projections plus the
    norms, rotary embedding, activation and add, priced the way ``CostModel.stage_time`` prices a stage
    (one roofline over the summed bytes and FLOPs, the floor times the number of kernels)."""

    model: str
    tokens: int
    tp: int
    split: str
    gemm_ms: float  # measured, the four projections
    other_ms: float  # measured, the rest
    before_ms: float
    after_ms: float


@dataclass
class TableFit:
    calibration: Calibration
    points: list[PointRow]
    errors: list[ErrorRow]  # per model and split, then "all" per split
    allreduce: list[AllReduceRow]
    layers: list[LayerRow]
    defaults: dict[str, float]  # the "before" values of every fitted constant


def layer_gemms(spec: ModelSpec, tokens: int, tp: int) -> list[OpCost]:
    """The four projections of one dense layer at TP ``tp``, as the cost model counts them."""
    if spec.is_moe or spec.attention != "gqa":
        raise TableError(f"model {spec.name!r} is not a dense GQA model; the operator tables cover only "
                         "those")
    h, hd = spec.hidden, spec.qk_head_dim
    inter = spec.dense_mlp_params // (3 * h)
    params = {
        "attn_pre_proj": h * (spec.num_heads + 2 * spec.num_kv_heads) * hd,
        "attn_post_proj": spec.num_heads * hd * h,
        "mlp_up_proj": 2 * h * inter,
        "mlp_down_proj": inter * h,
    }
    attn, mlp = spec.attn_bytes_per_param, spec.dense_mlp_bytes_per_param
    per_param = {"attn_pre_proj": attn, "attn_post_proj": attn, "mlp_up_proj": mlp, "mlp_down_proj": mlp}
    return [OpCost(op, params[op] * per_param[op] / tp, 2.0 * tokens * params[op] / tp) for op in GEMM_OPS]


def kernel_seconds(nbytes: np.ndarray, flops: np.ndarray, eta_mem: float, eta_compute: float,
                   kernel_floor_us: float, hw: HardwareConf) -> np.ndarray:
    """The roofline of one kernel, as ``CostModel.stage_time`` prices a stage."""
    return np.maximum.reduce([nbytes / (eta_mem * hw.mem_bw_gbs * 1e9),
                              flops / (eta_compute * hw.peak_tflops_bf16 * 1e12),
                              np.full_like(nbytes, kernel_floor_us * 1e-6)])


def allreduce_seconds(workers: np.ndarray, nbytes: np.ndarray, latency_us: float, eta_link: float,
                      hw: HardwareConf) -> np.ndarray:
    """One ring all-reduce, as ``CostModel.comm_time`` prices it."""
    return latency_us * 1e-6 + 2.0 * (workers - 1) / workers * nbytes / (eta_link * hw.link_bw_gbs * 1e9)


# -- reading -----------------------------------------------------------------------------------------------

def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    if not path.is_file():
        raise TableError(f"table not found: {path}")
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        raise TableError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TableError(f"{path}: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise TableError(f"{path}: the table has no rows")
    values = df[columns].apply(pd.to_numeric, errors="coerce")
    if values.isna().any().any() or (values.to_numpy() <= 0).any():
        raise TableError(f"{path}: every value in {', '.join(columns)} must be a positive number")
    return values


def _provenance(tables_dir: Path) -> dict[str, str]:
    """``source.yaml`` beside the tables (repo, commit); tables without one are reported as such."""
    path = tables_dir / "source.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(data, dict):
        return {"repo": "unknown", "commit": "unknown"}
    return {"repo": str(data.get("repo", "unknown")), "commit": str(data.get("commit", "unknown"))}


def _model_table(tables_dir: Path, device: str, model: str, models_dir: Path) -> tuple[pd.DataFrame,
                                                                                        ModelSpec, str]:
    if model not in VIDUR_MODELS:
        raise TableError(f"no operator table for model {model!r}; known: {', '.join(sorted(VIDUR_MODELS))}")
    rel = f"compute/{device}/{VIDUR_MODELS[model]}/mlp.csv"
    try:
        spec = load_model_spec(str(models_dir / model))
    except ModelConfigError as exc:
        raise TableError(f"model {model!r} has no usable config: {exc}") from None
    cols = [TOKENS, TP, "n_head", "n_kv_head", "n_embd", "n_expanded_embd"]
    df = _read_csv(tables_dir / rel, cols + [time_column(op) for op in GEMM_OPS + OTHER_OPS])
    # The table must describe the same architecture as the config we price it with.
    inter = spec.dense_mlp_params // (3 * spec.hidden)
    want = {"n_head": spec.num_heads, "n_kv_head": spec.num_kv_heads, "n_embd": spec.hidden,
            "n_expanded_embd": inter}
    for col, value in want.items():
        seen = sorted(set(df[col].astype(int)))
        if seen != [value]:
            raise TableError(f"{rel}: {col} is {seen}, but models/{model}/config.json says {value}")
    return df, spec, rel


# -- fitting -----------------------------------------------------------------------------------------------

def _gemm_points(df: pd.DataFrame, spec: ModelSpec, model: str, split: str) -> tuple[list[dict], list[dict]]:
    """Per-kernel points of the four projections, and per-row layer sums (for the stage-level check)."""
    kernels, layers = [], []
    for rec in df.to_dict("records"):
        n, t = int(rec[TOKENS]), int(rec[TP])
        costs = layer_gemms(spec, n, t)
        for cost in costs:
            kernels.append({"model": model, "op": cost.op, "tokens": n, "tp": t, "bytes": cost.bytes,
                            "flops": cost.flops, "measured_s": rec[time_column(cost.op)] * 1e-3,
                            "split": split})
        layers.append({"model": model, "tokens": n, "tp": t, "split": split,
                       "bytes": sum(c.bytes for c in costs), "flops": sum(c.flops for c in costs),
                       "gemm_ms": sum(float(rec[time_column(op)]) for op in GEMM_OPS),
                       "other_ms": sum(float(rec[time_column(op)]) for op in OTHER_OPS)})
    return kernels, layers


def octave_weights(values: np.ndarray) -> np.ndarray:
    """Weights that give every octave [2^k, 2^(k+1)) of ``values`` the same total weight.

    The tables sample token counts (and message sizes) on a linear grid: three quarters of Vidur's token
    counts are above 512, where every GEMM is compute-bound. Unweighted, those points decide the fit and
    the decode-sized kernels (1-256 tokens, memory-bound: where a serving step spends most of its time)
    barely count."""
    octave = np.floor(np.log2(values)).astype(int)
    _, inverse, counts = np.unique(octave, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def _fit_roofline(points: pd.DataFrame, hw: HardwareConf) -> tuple[np.ndarray, float]:
    """(eta_mem, eta_compute, kernel_floor_us) minimising octave-weighted squared log error; the max()
    has kinks, so a few starts are tried and the best kept. Returns the weighted RMS log residual."""
    b, f = points["bytes"].to_numpy(), points["flops"].to_numpy()
    log_meas = np.log(points["measured_s"].to_numpy())
    w = octave_weights(points["tokens"].to_numpy(float))
    sw = np.sqrt(w / w.sum())

    def resid(x: np.ndarray) -> np.ndarray:
        return sw * (np.log(kernel_seconds(b, f, x[0], x[1], x[2], hw)) - log_meas)

    best = None
    for x0 in ([0.75, 0.6, 2.0], [0.5, 0.8, 8.0], [0.9, 0.4, 1.0], [0.6, 0.6, 5.0]):
        res = least_squares(resid, x0, bounds=([0.05, 0.05, 0.0], [1.0, 1.0, 100.0]), x_scale=[0.1, 0.1, 1.0])
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return best.x, math.sqrt(2.0 * best.cost)


def _fit_allreduce(df: pd.DataFrame, hw: HardwareConf) -> tuple[np.ndarray, float]:
    """(allreduce_latency_us, eta_link), octave-weighted by message size like the kernels."""
    w, s = df["num_workers"].to_numpy(float), df["size"].to_numpy(float)
    log_meas = np.log(df[ALLREDUCE_TIME].to_numpy() * 1e-3)
    weight = octave_weights(s)
    sw = np.sqrt(weight / weight.sum())

    def resid(x: np.ndarray) -> np.ndarray:
        return sw * (np.log(allreduce_seconds(w, s, x[0], x[1], hw)) - log_meas)

    res = least_squares(resid, [hw.allreduce_latency_us or 10.0, 0.7], bounds=([0.0, 0.01], [1000.0, 1.0]),
                        x_scale=[1.0, 0.1])
    return res.x, math.sqrt(2.0 * res.cost)


def _errors(label: str, split: str, meas: np.ndarray, before: np.ndarray, after: np.ndarray) -> ErrorRow:
    eb, ea = np.abs(before / meas - 1.0) * 100.0, np.abs(after / meas - 1.0) * 100.0
    return ErrorRow(label, split, len(meas), float(eb.mean()), float(ea.mean()), float(eb.max()),
                    float(ea.max()))


def layer_seconds(nbytes: np.ndarray, flops: np.ndarray, kernels: int, eta_mem: float, eta_compute: float,
                  kernel_floor_us: float, hw: HardwareConf) -> np.ndarray:
    """A layer priced like a stage: one roofline over its summed bytes and FLOPs, floor x kernels."""
    return np.maximum(kernel_seconds(nbytes, flops, eta_mem, eta_compute, 0.0, hw),
                      kernels * kernel_floor_us * 1e-6)


def fit_tables(tables_dir: Path, hardware: str, fit_models: list[str], holdout_models: list[str], *,
               name: str | None = None, models_dir: Path | None = None) -> TableFit:
    """Fit the roofline constants on ``fit_models`` and the all-reduce curve, and report errors before
    (default constants) and after, separately for the fit and the held-out models."""
    tables_dir = Path(tables_dir)
    if not tables_dir.is_dir():
        raise TableError(f"tables directory not found: {tables_dir}")
    if hardware not in VIDUR_DEVICES:
        raise TableError(f"no operator tables for hardware {hardware!r}; known: {', '.join(VIDUR_DEVICES)}")
    if not fit_models:
        raise TableError("no fit models given; name at least one of " + ", ".join(sorted(VIDUR_MODELS)))
    both = sorted(set(fit_models) & set(holdout_models))
    if both:
        raise TableError(f"model(s) {', '.join(both)} are both fitted and held out; a model is one or the "
                         "other")
    try:
        hw = load_hardware(hardware)
    except HardwareError as exc:
        raise TableError(str(exc)) from None
    models_dir = models_dir or shipped_models_dir()
    device, node = VIDUR_DEVICES[hardware]
    prov = _provenance(tables_dir)

    rows: list[dict] = []
    layer_rows: list[dict] = []
    paths: dict[str, str] = {}
    for split, models in (("fit", fit_models), ("held-out", holdout_models)):
        for model in models:
            df, spec, rel = _model_table(tables_dir, device, model, models_dir)
            paths[model] = rel
            kernels, layers = _gemm_points(df, spec, model, split)
            rows += kernels
            layer_rows += layers
    pts = pd.DataFrame(rows)
    fit_pts = pts[pts["split"] == "fit"]  # the only rows the optimiser sees
    (eta_mem, eta_compute, floor_us), rms_log = _fit_roofline(fit_pts, hw)

    d = CostParams()
    b, f = pts["bytes"].to_numpy(), pts["flops"].to_numpy()
    pts["before_s"] = kernel_seconds(b, f, d.eta_mem, d.eta_compute, d.kernel_floor_us, hw)
    pts["after_s"] = kernel_seconds(b, f, eta_mem, eta_compute, floor_us, hw)
    points = [PointRow(r.model, r.op, r.tokens, r.tp, r.measured_s * 1e3, r.before_s * 1e3, r.after_s * 1e3,
                       r.split) for r in pts.itertuples()]
    errors = []
    for split in ("fit", "held-out"):
        part = pts[pts["split"] == split]
        for model in dict.fromkeys(part["model"]):
            m = part[part["model"] == model]
            errors.append(_errors(model, split, m["measured_s"].to_numpy(), m["before_s"].to_numpy(),
                                  m["after_s"].to_numpy()))
        if len(part):
            errors.append(_errors("all", split, part["measured_s"].to_numpy(), part["before_s"].to_numpy(),
                                  part["after_s"].to_numpy()))

    lay = pd.DataFrame(layer_rows)
    lb, lf, nk = lay["bytes"].to_numpy(), lay["flops"].to_numpy(), len(GEMM_OPS) + len(OTHER_OPS)
    lay["before_ms"] = layer_seconds(lb, lf, nk, d.eta_mem, d.eta_compute, d.kernel_floor_us, hw) * 1e3
    lay["after_ms"] = layer_seconds(lb, lf, nk, eta_mem, eta_compute, floor_us, hw) * 1e3
    layers_out = [LayerRow(r.model, r.tokens, r.tp, r.split, r.gemm_ms, r.other_ms, r.before_ms, r.after_ms)
                  for r in lay.itertuples()]

    ar_rel = f"network/{node}/all_reduce.csv"  # Vidur's path: data/profiling/ + this
    ar = _read_csv(tables_dir / ar_rel, ["num_workers", "size", ALLREDUCE_TIME])
    (latency_us, eta_link), ar_rms = _fit_allreduce(ar, hw)
    w, s = ar["num_workers"].to_numpy(float), ar["size"].to_numpy(float)
    ar_before = allreduce_seconds(w, s, hw.allreduce_latency_us, d.eta_link, hw)
    ar_after = allreduce_seconds(w, s, latency_us, eta_link, hw)
    allreduce = [AllReduceRow(int(wi), int(si), float(mi), float(bi * 1e3), float(ai * 1e3))
                 for wi, si, mi, bi, ai in zip(w, s, ar[ALLREDUCE_TIME], ar_before, ar_after, strict=True)]

    cal = _calibration(name or f"{hardware}-vidur", hardware, prov, paths, fit_models, holdout_models,
                       fitted={"eta_mem": eta_mem, "eta_compute": eta_compute, "kernel_floor_us": floor_us},
                       rms_log=rms_log, n_fit=len(fit_pts), errors=errors,
                       allreduce_fit=(latency_us, eta_link, ar_rms, ar_rel, allreduce))
    defaults = {"eta_mem": d.eta_mem, "eta_compute": d.eta_compute, "kernel_floor_us": d.kernel_floor_us,
                "eta_link": d.eta_link, "allreduce_latency_us": hw.allreduce_latency_us}
    return TableFit(cal, points, errors, allreduce, layers_out, defaults)


def _allreduce_errors(rows: list[AllReduceRow]) -> list[ErrorRow]:
    out = []
    for workers in sorted({r.workers for r in rows}):
        sel = [r for r in rows if r.workers == workers]
        out.append(_errors(f"{workers} GPUs", "fit", np.array([r.measured_ms for r in sel]),
                           np.array([r.before_ms for r in sel]), np.array([r.after_ms for r in sel])))
    return out


def _calibration(name: str, hardware: str, prov: dict[str, str], paths: dict[str, str], fit_models: list[str],
                 holdout_models: list[str], fitted: dict[str, float], rms_log: float, n_fit: int,
                 errors: list[ErrorRow], allreduce_fit: tuple) -> Calibration:
    latency_us, eta_link, ar_rms, ar_rel, ar_rows = allreduce_fit
    at = f"{prov['repo']}@{prov['commit']}"
    fit_paths = ", ".join(VIDUR_PREFIX + paths[m] for m in fit_models)
    summary = {(e.model, e.split): e for e in errors}
    fit_all, held_all = summary.get(("all", "fit")), summary.get(("all", "held-out"))
    held = (f"; held-out {', '.join(holdout_models)}: MAPE {held_all.mape_after:.1f} %"
            if held_all else "; no held-out models")
    op_source = (f"least squares on log time, each octave of token counts weighted alike, over {n_fit} "
                 f"kernel times ({', '.join(GEMM_OPS)}; TP and token counts as published) from {at} "
                 f"{fit_paths}; weighted RMS log residual {rms_log:.3f}; "
                 f"fit MAPE {fit_all.mape_after:.1f} %{held}" if fit_all else "")
    ar_errors = _allreduce_errors(ar_rows)
    workers = ", ".join(e.model for e in ar_errors)
    ar_source = (f"least squares on log time, each octave of sizes weighted alike, over {len(ar_rows)} "
                 f"NCCL all-reduce times ({workers}; "
                 f"{min(r.size_bytes for r in ar_rows)} B to {max(r.size_bytes for r in ar_rows)} B) from "
                 f"{at} {VIDUR_PREFIX}{ar_rel}; weighted RMS log residual {ar_rms:.3f}")
    return Calibration(
        name=name, hardware=hardware,
        source=(f"Fitted to Vidur's published H100 profiles ({at}, MIT licence; trimmed copy in "
                f"data/vidur/): "
                f"per-layer projection GEMM kernel times of {', '.join(fit_models)} (held out: "
                f"{', '.join(holdout_models) or 'none'}) and NCCL all-reduce times. Kernel times are GPU "
                f"time from Vidur's profiler, not SGLang's; host costs are not fitted."),
        params={**{k: {"value": round(float(v), 4), "source": op_source} for k, v in fitted.items()},
                "eta_link": {"value": round(float(eta_link), 4), "source": ar_source}},
        hardware_overrides={"allreduce_latency_us": {"value": round(float(latency_us), 2),
                                                     "source": ar_source}},
        fit={
            "tables": {"repo": prov["repo"], "commit": prov["commit"],
                       "operators": [VIDUR_PREFIX + paths[m] for m in fit_models + holdout_models],
                       "allreduce": VIDUR_PREFIX + ar_rel},
            "fit_models": list(fit_models), "holdout_models": list(holdout_models),
            "operators": [_error_dict(e) for e in errors],
            "allreduce": [_error_dict(e) for e in ar_errors],
            "rms_log_residual": {"operators": round(rms_log, 4), "allreduce": round(float(ar_rms), 4)},
        })


def _error_dict(e: ErrorRow) -> dict:
    return {"model": e.model, "split": e.split, "points": e.points,
            "mape_before_pct": round(e.mape_before, 2), "mape_after_pct": round(e.mape_after, 2),
            "max_error_before_pct": round(e.max_before, 1), "max_error_after_pct": round(e.max_after, 1)}


# -- report ------------------------------------------------------------------------------------------------

def _error_table(rows: list[ErrorRow], first: str) -> list[str]:
    out = [f"| {first} | set | points | MAPE before | MAPE after | max error before | max error after |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {e.model} | {e.split} | {e.points} | {e.mape_before:.1f} % | {e.mape_after:.1f} % | "
            f"{e.max_before:.0f} % | {e.max_after:.0f} % |" for e in rows]
    return out


TOKEN_RANGES = ((1, 64), (65, 512), (513, 4096))


def _point_errors(label: str, split: str, sel: list[PointRow]) -> ErrorRow:
    return _errors(label, split, np.array([p.measured_ms for p in sel]), np.array([p.before_ms for p in sel]),
                   np.array([p.after_ms for p in sel]))


def _layer_errors(rows: list[LayerRow]) -> list[ErrorRow]:
    out = []
    for split in ("fit", "held-out"):
        for lo, hi in TOKEN_RANGES:
            sel = [r for r in rows if r.split == split and lo <= r.tokens <= hi]
            if sel:
                out.append(_errors(f"{lo}-{hi}", split, np.array([r.gemm_ms + r.other_ms for r in sel]),
                                   np.array([r.before_ms for r in sel]), np.array([r.after_ms for r in sel])))
    return out


def fidelity_markdown(fit: TableFit) -> str:
    """The fidelity report: fitted constants, errors per model and set, per operator, all-reduce."""
    cal = fit.calibration
    entries = {**cal.params, **cal.hardware_overrides}
    lines = ["| constant | default | fitted |", "| --- | ---: | ---: |"]
    lines += [f"| `{k}` | {fit.defaults[k]:g} | {v['value']:g} |" for k, v in entries.items()]
    lines += ["", "Per-layer projection kernels (QKV, O, gate+up, down), every TP degree and token count "
              "in the tables; error = |model − measured| / measured:", ""]
    lines += _error_table(fit.errors, "model")
    by_op = []
    for split in ("fit", "held-out"):
        for op in GEMM_OPS:
            sel = [p for p in fit.points if p.split == split and p.op == op]
            if sel:
                by_op.append(_point_errors(op, split, sel))
    lines += ["", "By operator:", "", *_error_table(by_op, "operator")]
    by_range = []
    for split in ("fit", "held-out"):
        for lo, hi in TOKEN_RANGES:
            sel = [p for p in fit.points if p.split == split and lo <= p.tokens <= hi]
            if sel:
                by_range.append(_point_errors(f"{lo}-{hi}", split, sel))
    lines += ["", "By token count (decode batches sit in the first range, prefill chunks in the last):", ""]
    lines += _error_table(by_range, "tokens")
    lines += ["", "All-reduce (`allreduce_latency_us` + `eta_link`), all message sizes in the table:", ""]
    lines += _error_table(_allreduce_errors(fit.allreduce), "GPUs")
    lines += ["", "The same constants priced the way `CostModel.stage_time` prices a stage: one layer "
              "(without its attention kernel) as one roofline over the summed bytes and FLOPs of the four "
              "projections, "
              f"floor × {len(GEMM_OPS) + len(OTHER_OPS)} kernels, against the measured sum of all nine "
              "operators:", ""]
    lines += _error_table(_layer_errors(fit.layers), "tokens")
    lines += ["", "Measured time of the norms, rotary embedding, activation and residual add (the cost model "
              "counts a kernel each for them, but no bytes) as a share of that layer time, TP 1:", "",
              "| model | tokens | other ops | layer | share |", "| --- | ---: | ---: | ---: | ---: |"]
    for model in dict.fromkeys(r.model for r in fit.layers):
        tp1 = [r for r in fit.layers if r.model == model and r.tp == 1]
        for r in (min(tp1, key=lambda r: r.tokens), max(tp1, key=lambda r: r.tokens)):
            total = r.gemm_ms + r.other_ms
            lines.append(f"| {model} | {r.tokens} | {r.other_ms:.3f} ms | {total:.3f} ms | "
                         f"{100 * r.other_ms / total:.0f} % |")
    return "\n".join(lines) + "\n"

