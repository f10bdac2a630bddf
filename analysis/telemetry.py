"""Per-load-point summaries of the trial's telemetry: the GPU samples (``vocab.telemetry.GPU_COLUMNS``)
and the per-stage scheduler series (``vocab.telemetry.STAGE_COLUMNS``), cut to one point's window.

The summaries carry the names in ``vocab/telemetry.py`` whichever source wrote the series (NVML, the
simulated engine's GPU model, SGLang's log or ``/metrics``); the source is named where a person reads
them, not here. Everything is pandas/numpy on small frames (a few thousand rows per point).

Choices worth knowing:

* Energy is read from each GPU's energy counter, never integrated from power: the counter is what the
  board measured, a power integral over 10 Hz samples is not. A window that starts or ends between two
  samples gets its share by linear interpolation between the samples that bracket its edge.
* A throttle sample stands for the interval up to the next sample (a sample is a state, not an event).
* "Activity" is power above idle over the idle-to-limit range, not NVML utilisation, because
  utilisation counts a kernel spin-waiting on a pipeline peer as busy.
* Under PP every stage replicates the scheduler, so a replica's queue and retraction counter are read
  once per replica (not summed over its stages); ``running`` is per micro-batch (see STAGE_COLUMNS).
* Scheduler series: a column's values come from the engine log rows when the window has any, else from
  the ``/metrics`` rows (the log is per batch, the gauges only as fresh as the scrape).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from vocab.telemetry import (
    ENERGY_J,
    J_PER_TOKEN,
    KV_USAGE_MAX,
    LOG_CACHE_HIT_RATE,
    LOG_CACHED_TOKENS,
    LOG_COMPUTED_TOKENS,
    MEM_USED_MAX,
    POWER_FRAC_MAX_GPU,
    POWER_FRAC_MEAN,
    POWER_FRAC_MIN_GPU,
    POWER_FRAC_PEAK,
    PREFILL_TOKENS_MAX,
    PREFILL_TOKENS_MEAN,
    PREFILL_WITH_DECODES,
    QUEUE_GROWTH,
    QUEUE_MEAN,
    RANK_KV_USAGE,
    RANK_QUEUE,
    RANK_QUEUE_SPREAD,
    RANK_RUNNING,
    RANK_RUNNING_IMBALANCE,
    RETRACTED,
    RUNNING_MEAN,
    SPEC_ACCEPT_LEN,
    STAGE_ACTIVITY_MAX,
    STAGE_ACTIVITY_MEAN,
    STAGE_ACTIVITY_MIN,
    THROTTLED_S,
    UTIL_MEAN,
    GpuPlace,
    per_gpu,
    per_replica,
    per_stage,
)

GIB = float(1 << 30)


def point_telemetry(gpu: pd.DataFrame | None, stages: pd.DataFrame | None, start: float, end: float,
                    output_tokens: int, idle_power_w: float, layout: list[GpuPlace]) -> dict[str, float]:
    """The summaries of one load point's window [start, end] (epoch seconds); {} when nothing was
    recorded in it. ``layout`` places each GPU in a pipeline stage (GPUs not in it count for the
    GPU-wide summaries only)."""
    if not end >= start:
        return {}
    out: dict[str, float] = {}
    if gpu is not None and not gpu.empty and "ts" in gpu and "gpu" in gpu:
        out.update(_gpu_summaries(gpu, start, end, output_tokens, idle_power_w, layout))
    if stages is not None and not stages.empty and "ts" in stages:
        out.update(_stage_summaries(stages, start, end))
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


# ---- GPU samples ---------------------------------------------------------------------------------

def _col(df: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, all NaN when the source did not write it."""
    if name not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def _gpu_summaries(gpu: pd.DataFrame, start: float, end: float, output_tokens: int, idle_power_w: float,
                   layout: list[GpuPlace]) -> dict[str, float]:
    df = pd.DataFrame({"ts": _col(gpu, "ts"), "gpu": _col(gpu, "gpu"), "power": _col(gpu, "power_w"),
                       "limit": _col(gpu, "power_limit_w"), "util": _col(gpu, "util_gpu_pct"),
                       "mem": _col(gpu, "mem_used_bytes"), "throttle": _col(gpu, "throttle_reasons"),
                       "energy": _col(gpu, "energy_j")})
    df = df[df["ts"].notna() & df["gpu"].notna()].sort_values("ts", kind="stable")
    df["gpu"] = df["gpu"].astype(int)
    limit = df["limit"].where(df["limit"] > 0)
    df["frac"] = df["power"] / limit
    df["activity"] = ((df["power"] - idle_power_w) / (limit - idle_power_w).where(limit > idle_power_w)
                      ).clip(0.0, 1.0)
    inside = df[(df["ts"] >= start) & (df["ts"] <= end)]
    out: dict[str, float] = {}

    per = inside.groupby("gpu").agg(frac_mean=("frac", "mean"), frac_peak=("frac", "max"),
                                    util_mean=("util", "mean"), activity=("activity", "mean"))
    for g, row in per.iterrows():
        out[per_gpu(int(g), "power_frac_mean")] = row["frac_mean"]
        out[per_gpu(int(g), "power_frac_peak")] = row["frac_peak"]
        out[per_gpu(int(g), "util_mean_pct")] = row["util_mean"]
    fracs = per["frac_mean"].dropna()
    if len(fracs):
        out[POWER_FRAC_MEAN] = fracs.mean()
        out[POWER_FRAC_MIN_GPU] = fracs.min()
        out[POWER_FRAC_MAX_GPU] = fracs.max()
        out[POWER_FRAC_PEAK] = inside["frac"].max()
    if per["util_mean"].notna().any():
        out[UTIL_MEAN] = per["util_mean"].mean()
    if inside["mem"].notna().any():
        out[MEM_USED_MAX] = inside["mem"].max() / GIB

    energy = [e for _, g in df.groupby("gpu") if (e := _counter_increase(g, start, end)) is not None]
    if energy:
        out[ENERGY_J] = sum(energy)
        if output_tokens > 0:
            out[J_PER_TOKEN] = out[ENERGY_J] / output_tokens
    throttled = [t for _, g in df.groupby("gpu") if (t := _throttled_s(g, start, end)) is not None]
    if throttled:
        out[THROTTLED_S] = max(throttled)

    stage_of = {p.gpu: p.pp for p in layout}
    activity = per["activity"].dropna()
    by_stage: dict[int, list[float]] = {}
    for g, a in activity.items():
        if int(g) in stage_of:
            by_stage.setdefault(stage_of[int(g)], []).append(float(a))
    stage_means = {s: sum(v) / len(v) for s, v in sorted(by_stage.items())}
    for s, a in stage_means.items():
        out[per_stage(s, "activity_mean")] = a
    if stage_means:
        values = list(stage_means.values())
        out[STAGE_ACTIVITY_MEAN] = sum(values) / len(values)
        out[STAGE_ACTIVITY_MIN] = min(values)
        out[STAGE_ACTIVITY_MAX] = max(values)
    return out


def _counter_increase(g: pd.DataFrame, start: float, end: float) -> float | None:
    """One GPU's energy counter over the window (``counter_increase``), spread between its readings by
    the power samples."""
    read = g[g["energy"].notna()]
    powered = g[g["power"].notna()]
    return counter_increase(read["ts"].to_numpy(float), read["energy"].to_numpy(float), start, end,
                            powered["ts"].to_numpy(float), powered["power"].to_numpy(float))


def counter_increase(ts: np.ndarray, values: np.ndarray, start: float, end: float,
                     rate_ts: np.ndarray | None = None, rate: np.ndarray | None = None) -> float | None:
    """A counter sampled at ``ts`` (ascending), read at ``end`` minus at ``start``; None when no samples
    overlap the window, or the counter went backwards (a reset). Each end is interpolated between the
    two readings around it (held at the first/last reading beyond the sampled span): in proportion to
    time, or, given samples of the counter's rate (``rate`` at ``rate_ts``: the power beside the
    energy counter), in proportion to the rate's integral, so that a counter read once a second still
    puts a load that starts between two readings where the power says it started."""
    if len(ts) == 0 or ts[0] > end or ts[-1] < start:
        return None
    increase = _counter_at(end, ts, values, rate_ts, rate) - _counter_at(start, ts, values, rate_ts, rate)
    return increase if increase >= 0 else None


def _counter_at(t: float, ts: np.ndarray, values: np.ndarray, rate_ts: np.ndarray | None,
                rate: np.ndarray | None) -> float:
    if t <= ts[0] or t >= ts[-1] or rate_ts is None or rate is None or len(rate_ts) == 0:
        return float(np.interp(t, ts, values))
    i = int(np.searchsorted(ts, t, side="right")) - 1
    t0, t1 = float(ts[i]), float(ts[i + 1])
    # the rate between the two readings: its samples there, and at both readings (interpolated)
    inner = (rate_ts > t0) & (rate_ts < t1)
    grid = np.concatenate(([t0], rate_ts[inner], [t1]))
    level = np.concatenate(([np.interp(t0, rate_ts, rate)], rate[inner], [np.interp(t1, rate_ts, rate)]))
    area = np.concatenate(([0.0], np.cumsum(np.diff(grid) * (level[1:] + level[:-1]) / 2.0)))
    if not area[-1] > 0:
        return float(np.interp(t, ts, values))
    share = float(np.interp(t, grid, area)) / float(area[-1])
    return float(values[i] + share * (values[i + 1] - values[i]))


def _throttled_s(g: pd.DataFrame, start: float, end: float) -> float | None:
    """Seconds of [start, end] during which the GPU reported a throttle reason; None when it reported
    none over a span that overlaps the window."""
    g = g[g["throttle"].notna()]
    ts = g["ts"].to_numpy()
    if len(ts) == 0 or ts[0] > end or ts[-1] < start:
        return None
    begin = np.clip(ts, start, end)
    until = np.clip(np.append(ts[1:], ts[-1]), start, end)  # the last sample stands for no time
    return float(np.sum((until - begin)[g["throttle"].to_numpy() != 0]))


# ---- scheduler series ----------------------------------------------------------------------------

def _preferred(window: pd.DataFrame, column: str) -> pd.DataFrame:
    """Rows with a value of ``column``: the engine log's when the window has any, else ``/metrics``'."""
    rows = window[window[column].notna()]
    if "source" not in rows:
        return rows
    log_rows = rows[rows["source"] == "log"]
    return log_rows if len(log_rows) else rows[rows["source"] == "metrics"]


def _stage_summaries(stages: pd.DataFrame, start: float, end: float) -> dict[str, float]:
    df = pd.DataFrame({c: _col(stages, c) for c in ("ts", "dp", "pp", "tp", "running", "queue",
                                                     "token_usage", "retracted_total", "new_tokens",
                                                     "cached_tokens", "accept_len")})
    for text in ("source", "kind"):
        if text in stages:
            df[text] = stages[text].astype(str)
    df[["dp", "pp", "tp"]] = df[["dp", "pp", "tp"]].fillna(0)
    df = df[df["ts"].notna()].sort_values("ts", kind="stable")
    window = df[(df["ts"] >= start) & (df["ts"] <= end)]
    out: dict[str, float] = {}

    running = _preferred(window, "running")
    stage_running = running.groupby("pp")["running"].mean()
    for s, v in stage_running.items():
        out[per_stage(int(s), "running_mean")] = v
    if len(stage_running):
        out[RUNNING_MEAN] = stage_running.mean()
    queue = _preferred(window, "queue")
    for s, v in queue.groupby("pp")["queue"].mean().items():
        out[per_stage(int(s), "queue_mean")] = v
    if len(queue):  # a replica's stages report the same queue: read stage 0's, add the replicas up
        first = queue[queue["pp"] == queue["pp"].min()]
        out[QUEUE_MEAN] = float(first.groupby("dp")["queue"].mean().sum())
    slopes = [_slope(g["ts"].to_numpy(), g["queue"].to_numpy()) for _, g in queue.groupby("dp")]
    if any(s is not None for s in slopes):
        out[QUEUE_GROWTH] = sum(s for s in slopes if s is not None)  # replicas queue separately
    usage = _preferred(window, "token_usage")
    if len(usage):
        out[KV_USAGE_MAX] = usage["token_usage"].max()
    out.update(_prefill_summaries(window))
    out.update(_rank_summaries(running, queue, usage))
    accept = _preferred(window[window["kind"] != "prefill"] if "kind" in window else window, "accept_len")
    if len(accept):
        accept = accept[(accept["pp"] == accept["pp"].min()) & (accept["accept_len"] > 0)]
    if len(accept):  # each line is its interval's mean; an idle interval reports 0 (nothing verified)
        out[SPEC_ACCEPT_LEN] = float(accept["accept_len"].mean())
    retracted = _retracted(df, start, end)
    if retracted is not None:
        out[RETRACTED] = retracted
    return out


def _rank_summaries(running: pd.DataFrame, queue: pd.DataFrame, usage: pd.DataFrame) -> dict[str, float]:
    """Each scheduler's own numbers where the engine has several (attention-DP ranks, or replicas behind
    its own DP controller; their reports carry ``dp_rank`` / ``DP<i>``), read at the first PP stage, and
    how unevenly the load fell on them (vocab.telemetry: RANK_*)."""
    if running.empty or running["dp"].nunique() < 2:
        return {}
    out: dict[str, float] = {}
    first = running[running["pp"] == running["pp"].min()]
    per_rank = first.groupby("dp")["running"].mean()
    for r, v in per_rank.items():
        out[per_replica(int(r), RANK_RUNNING)] = float(v)
    if per_rank.mean() > 0:
        out[RANK_RUNNING_IMBALANCE] = float(per_rank.max() / per_rank.mean())
    waiting = queue[queue["pp"] == queue["pp"].min()].groupby("dp")["queue"].mean()
    for r, v in waiting.items():
        out[per_replica(int(r), RANK_QUEUE)] = float(v)
    if len(waiting) >= 2:
        out[RANK_QUEUE_SPREAD] = float(waiting.max() - waiting.min())
    for r, v in usage.groupby("dp")["token_usage"].max().items():
        out[per_replica(int(r), RANK_KV_USAGE)] = float(v)
    return out


def _prefill_summaries(window: pd.DataFrame) -> dict[str, float]:
    """Prompt tokens per prefill batch, and the share of prefill batches that ran beside decoding
    requests, from the engine log's prefill lines (stage 0's: every stage logs the same batch)."""
    if "kind" not in window:
        return {}
    rows = window[(window["kind"] == "prefill") & window["new_tokens"].notna()]
    rows = rows[rows["pp"] == rows["pp"].min()] if len(rows) else rows
    if rows.empty:
        return {}
    out = {PREFILL_TOKENS_MAX: float(rows["new_tokens"].max()),
           PREFILL_TOKENS_MEAN: float(rows["new_tokens"].mean())}
    cached = rows["cached_tokens"].dropna()
    if len(cached):  # every replica's stage 0 logs its own batches: their sums add up
        computed, hit = float(rows["new_tokens"].sum()), float(cached.sum())
        out[LOG_CACHED_TOKENS], out[LOG_COMPUTED_TOKENS] = hit, computed
        out[LOG_CACHE_HIT_RATE] = hit / (hit + computed) if hit + computed else 0.0
    running = rows["running"].dropna()
    if len(running):
        out[PREFILL_WITH_DECODES] = float((running > 0).mean())
    return out


def _slope(ts: np.ndarray, values: np.ndarray) -> float | None:
    """Least-squares slope of values against ts (per second); None with reports at fewer than 3 times
    (the stages of a replica report the same queue, so their rows at one time are one report)."""
    if len(np.unique(ts)) < 3:
        return None
    t = ts - ts.mean()
    return float(np.dot(t, values - values.mean()) / np.dot(t, t))


def _retracted(df: pd.DataFrame, start: float, end: float) -> float | None:
    """Requests retracted in [start, end]: each reporter's counter at its last report up to ``end`` minus
    at its last report up to ``start`` (its first report in the window when none came before). The
    stages and TP ranks of one replica replicate its scheduler, so a replica counts once (its highest
    increase); replicas add up."""
    rows = df[df["retracted_total"].notna() & (df["ts"] <= end)]
    chosen = _preferred(rows[rows["ts"] >= start], "retracted_total")
    if chosen.empty:
        return None
    if "source" in rows:
        rows = rows[rows["source"] == chosen["source"].iloc[0]]
    by_replica: dict[float, float] = {}
    for (dp, _pp, _tp), g in rows.groupby(["dp", "pp", "tp"]):
        before = g[g["ts"] <= start]
        base = before["retracted_total"].iloc[-1] if len(before) else g["retracted_total"].iloc[0]
        increase = max(0.0, float(g["retracted_total"].iloc[-1] - base))
        by_replica[dp] = max(by_replica.get(dp, 0.0), increase)
    return sum(by_replica.values()) if by_replica else None
