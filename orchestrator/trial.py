"""One trial: launch the engine, read its resolved configuration, drive every load point, always
tear down, then summarise, diagnose and log everything to the trial's MLflow run.

Records and telemetry are written to the trial directory as they are produced; MLflow gets them at
the end, also when the trial failed or was interrupted (with its status and the server log tail).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from orchestrator.config.identity import config_hash, resolved_config_dict
from orchestrator.config.model_info import read_model_info
from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import typed_config, validate, world_size
from orchestrator.engines.base import HOST
from orchestrator.engines.registry import get_engine
from orchestrator.errors import EngineStartError
from orchestrator.paths import PROJECT_ROOT
from orchestrator.process.server import ServerProcess, free_port, http_get_json, log_tail
from orchestrator.progress import ProgressView, ProgressWriter, TrialSlot
from orchestrator.sweep import ensure_started
from orchestrator.telemetry.server_metrics import MetricsScraper, jsonl_to_parquet
from orchestrator.tracking import Tracker, flatten

log = logging.getLogger("parasweep")

IN_RAY_ENV = "PARASWEEP_IN_RAY"  # set by the Ray launcher: the driver renders progress, not the trial
# resolved engine values worth a param of their own (from /server_info)
_RESOLVED_KEYS = ("max_running_requests", "pp_max_micro_batch_size", "chunked_prefill_size",
                  "max_prefill_tokens", "max_total_num_tokens", "context_length", "cuda_graph_max_bs_decode",
                  "disable_cuda_graph", "mem_fraction_static", "attention_backend", "pp_async_batch_depth",
                  "decode_log_interval", "disable_overlap_schedule", "random_seed")


@dataclass
class TrialContext:
    num: int
    label: str  # what a person reads: the trial's own overrides
    overrides: list[str]
    trial_dir: Path


@dataclass
class PointOutcome:
    label: str
    concurrency: int | None
    rate: float | None
    start: float
    end: float
    metrics: dict[str, float] = field(default_factory=dict)
    invalid_reasons: list[str] = field(default_factory=list)


def trial_context() -> TrialContext:
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    num = int(hc.job.num) if hc.job.get("num") is not None else 0
    label = " ".join(overrides) if overrides else "defaults"
    return TrialContext(num, label, overrides, Path(hc.runtime.output_dir).resolve())


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def load_points(cfg: ParasweepConf) -> list[Any]:
    from workloads import LoadPoint

    w = cfg.workload
    points = []
    for c in w.concurrency:
        n = w.requests_per_point or max(8, w.requests_per_concurrency * c)
        points.append(LoadPoint(concurrency=c, num_requests=n, warmup_requests=w.warmup_requests))
    for r in w.rate:
        n = w.requests_per_point or max(8, math.ceil(w.requests_per_concurrency * r))
        points.append(LoadPoint(rate=float(r), num_requests=n, warmup_requests=w.warmup_requests,
                                arrival=w.arrival))
    return points


def print_plan(ctx: TrialContext, cfg: ParasweepConf, engine: str, argv: list[str]) -> None:
    gpus = world_size(cfg)
    print(f"trial {ctx.num} [{ctx.label}]: engine={engine} model={cfg.model.name} "
          f"hardware={cfg.hardware.name} tp={cfg.tp.size} pp={cfg.pp.size} ep={cfg.ep.size} "
          f"dp={cfg.dp.size} world_size={gpus} GPUs={gpus}", flush=True)
    print("argv: " + json.dumps(argv), flush=True)


def run_trial(raw_cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task function body. Returns ``{"status": ok|failed|killed|skipped, "run_id", "timings"}``
    (timings: epoch seconds of task start, engine launch/ready, load start/end, end)."""
    task_start = time.time()
    cfg = typed_config(raw_cfg)
    engine_name = validate(cfg)
    ctx = trial_context()
    engine = get_engine(engine_name)
    port = free_port()
    argv = engine.argv(cfg, port, ctx.trial_dir)
    if cfg.dry_run:
        print_plan(ctx, cfg, engine_name, argv)
        return {"status": "skipped", "run_id": None, "timings": {}}

    ctx.trial_dir.mkdir(parents=True, exist_ok=True)
    parent_run_id = cfg.tracking.parent_run_id or ensure_started()  # single runs: this process
    resolved_cfg = resolved_config_dict(cfg, engine_name)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    run_id = tracker.start_run(
        f"{ctx.num}: {ctx.label}",
        tags={"parasweep.kind": "trial", "parasweep.status": "running", "parasweep.engine": engine_name,
              "parasweep.config_hash": config_hash(resolved_cfg), "parasweep.trial_num": str(ctx.num),
              "parasweep.overrides": ctx.label, "parasweep.git_sha": git_sha(),
              "parasweep.trial_dir": str(ctx.trial_dir)},
        parent_run_id=parent_run_id)
    tracker.log_params(run_id, flatten({k: v for k, v in resolved_cfg.items() if k != "tracking"}))

    progress = ProgressWriter(ctx.trial_dir, ctx.label)
    own_view = (ProgressView([TrialSlot(ctx.trial_dir, ctx.label, "running")])
                if not os.environ.get(IN_RAY_ENV) else contextlib.nullcontext())
    trial = _TrialRun(cfg, ctx, engine_name, argv, port, tracker, run_id, progress)
    trial.timings["task_start"] = task_start
    with own_view:
        status = trial.run()
    return {"status": status, "run_id": run_id, "timings": trial.timings}


class _TrialRun:
    """The stateful middle of a trial, so ``finally`` can log whatever exists at that moment."""

    def __init__(self, cfg: ParasweepConf, ctx: TrialContext, engine_name: str, argv: list[str], port: int,
                 tracker: Tracker, run_id: str, progress: ProgressWriter) -> None:
        self.cfg, self.ctx, self.engine_name, self.argv, self.port = cfg, ctx, engine_name, argv, port
        self.tracker, self.run_id, self.progress = tracker, run_id, progress
        d = ctx.trial_dir
        self.server_log = d / "server" / "server.log"
        self.records_jsonl = d / "records" / "requests.jsonl"
        self.metrics_jsonl = d / "telemetry" / "server_metrics.jsonl"
        self.server_info: dict[str, Any] = {}
        self.resolved: dict[str, Any] = {}
        self.outcomes: list[PointOutcome] = []
        self.timings: dict[str, float] = {}
        self.error = ""

    def run(self) -> str:
        status = "failed"
        try:
            self._measure()
            status = "ok"
        except KeyboardInterrupt:  # Ctrl-C in a single run, or Ray's soft cancel of this task
            status, self.error = "killed", "interrupted"
            raise
        except EngineStartError as exc:
            self.error = str(exc)
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self.progress.update(status=status, message=self.error.splitlines()[0] if self.error else "",
                                 force=True)
            self._finalize(status)
        return status

    def _measure(self) -> None:
        from workloads import RequestSpec, run_point

        cfg, d = self.cfg, self.ctx.trial_dir
        engine = get_engine(self.engine_name)
        engine.prepare(cfg, d)
        (d / "server").mkdir(parents=True, exist_ok=True)
        (d / "server" / "argv.json").write_text(json.dumps(self.argv, indent=1))
        self.progress.update(status="starting engine", force=True)
        env = dict(os.environ)  # CUDA_VISIBLE_DEVICES as Ray assigned it reaches the engine
        self.tracker.set_tags(self.run_id, {
            "parasweep.cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", "")})
        self.timings["engine_launch"] = time.time()
        with ServerProcess(self.argv, self.server_log, HOST, self.port, env=env,
                           stop_grace_s=cfg.engine.stop_grace_s) as server:
            server.wait_ready(cfg.engine.startup_timeout_s)
            self.timings["engine_ready"] = time.time()
            self._read_server_info(server.url)
            model = read_model_info(cfg.model.path)
            spec = RequestSpec(api=cfg.workload.api, input_len=cfg.workload.input_len,
                               output_len=cfg.workload.output_len, seed=cfg.workload.seed,
                               vocab_size=model.vocab_size, model=cfg.model.name)
            scraper = MetricsScraper(server.url + "/metrics", self.metrics_jsonl).start()
            try:
                points = load_points(cfg)
                self.timings["load_start"] = time.time()
                for i, point in enumerate(points):
                    self.progress.update(status="running", point=point.label, point_index=i,
                                         points_total=len(points), done=0, total=point.num_requests,
                                         force=True)

                    def on_progress(done: int, total: int, _label: str = point.label) -> None:
                        self.progress.update(done=done, total=total)

                    start = time.time()
                    result = run_point(server.url, point, spec, records_path=self.records_jsonl,
                                       on_progress=on_progress)
                    outcome = PointOutcome(point.label, point.concurrency, point.rate, start, time.time(),
                                           dict(result.metrics), list(result.invalid_reasons))
                    self.outcomes.append(outcome)
                    self._log_point(outcome)
                    log.info("%s: %s", point.label, _short_metrics(outcome.metrics))
                self.timings["load_end"] = time.time()
            finally:
                scraper.stop()

    def _read_server_info(self, url: str) -> None:
        self.server_info = http_get_json(url + "/server_info")
        path = self.ctx.trial_dir / "server" / "server_info.json"
        path.write_text(json.dumps(self.server_info, indent=1))
        states = self.server_info.get("internal_states") or [{}]
        resolved = {k: self.server_info.get(k) for k in _RESOLVED_KEYS if k in self.server_info}
        effective = states[0].get("effective_max_running_requests_per_dp")
        if effective is not None:  # the value the scheduler actually enforces
            resolved["max_running_requests"] = effective
        self.resolved = resolved
        self.tracker.log_params(self.run_id, {f"resolved.{k}": str(v) for k, v in resolved.items()})
        version = self.server_info.get("version", "unknown")
        engine_tag = self.server_info.get("engine")
        self.tracker.set_tags(self.run_id, {
            "parasweep.engine_version": f"{engine_tag} {version}" if engine_tag else str(version)})

    def _log_point(self, o: PointOutcome) -> None:
        step = o.concurrency if o.concurrency is not None else round(o.rate or 0)
        series = "" if o.concurrency is not None else "open/"
        batch = []
        for key, value in o.metrics.items():
            if isinstance(value, bool | int | float):
                batch.append((f"{o.label}/{key}", float(value), 0))
                batch.append((f"{series}{key}", float(value), step))
        self.tracker.log_metrics(self.run_id, batch)

    def _finalize(self, status: str) -> None:
        """Log artifacts, telemetry summaries, diagnosis and plots; never raise."""
        from analysis.diagnose import TrialFacts, diagnose
        from analysis.plots import plot_trial
        from analysis.telemetry import point_telemetry

        d, t, rid = self.ctx.trial_dir, self.tracker, self.run_id
        telemetry: dict[str, Any] = {}

        def records() -> None:
            if self.records_jsonl.exists():
                from workloads import read_records, records_to_dataframe

                df = records_to_dataframe(list(read_records(self.records_jsonl)))
                df.to_parquet(d / "records" / "requests.parquet", index=False)
                t.log_artifact(rid, d / "records" / "requests.parquet", "records")

        def server_metrics() -> None:
            telemetry["df"] = jsonl_to_parquet(self.metrics_jsonl, d / "telemetry" / "server_metrics.parquet")
            summary = []
            for o in self.outcomes:
                extra = point_telemetry(telemetry["df"], o.start, o.end)
                o.metrics.update(extra)
                summary += [(f"{o.label}/{k}", v, 0) for k, v in extra.items()]
            t.log_metrics(rid, summary)
            for path in (d / "telemetry").glob("*.parquet"):
                t.log_artifact(rid, path, "telemetry")

        def configs() -> None:
            cfg_dir = d / "config"
            cfg_dir.mkdir(parents=True, exist_ok=True)
            (cfg_dir / "resolved.yaml").write_text(
                yaml.safe_dump(resolved_config_dict(self.cfg, self.engine_name), sort_keys=False))
            (cfg_dir / "overrides.yaml").write_text(yaml.safe_dump(self.ctx.overrides))
            t.log_artifact(rid, cfg_dir / "resolved.yaml", "config")
            t.log_artifact(rid, cfg_dir / "overrides.yaml", "config")

        def server_files() -> None:
            for name in ("server.log", "server_info.json", "argv.json"):
                t.log_artifact(rid, d / "server" / name, "server")

        def findings() -> None:
            facts = TrialFacts(
                pp_size=self.cfg.pp.size, async_depth=self.cfg.pp.async_depth, resolved=self.resolved,
                points={o.label: {**o.metrics, "invalid_reason": "; ".join(o.invalid_reasons)}
                        for o in self.outcomes},
                concurrency={o.label: o.concurrency for o in self.outcomes if o.concurrency is not None})
            result = [f.to_dict() for f in diagnose(facts)]
            if status != "ok" and self.error:
                result.insert(0, {"id": "trial_failed", "severity": "critical",
                                  "title": f"Trial {status}", "evidence": self.error[-4000:],
                                  "suggestion": f"See server/server.log; tail:\n{log_tail(self.server_log)}"})
            (d / "diagnosis.json").write_text(json.dumps(result, indent=1))
            t.log_artifact(rid, d / "diagnosis.json")

        def plots() -> None:
            by_c = {o.concurrency: o.metrics for o in self.outcomes if o.concurrency is not None}
            for path in plot_trial(by_c, self.ctx.label, d / "plots"):
                t.log_artifact(rid, path, "plots")

        def errors() -> None:
            if self.error:
                t.set_tags(rid, {"parasweep.error": self.error[-2000:]})
                (d / "error.txt").write_text(self.error)
                t.log_artifact(rid, d / "error.txt")

        def timings() -> None:
            tm = self.timings
            tm["end"] = time.time()
            out = {"total_s": tm["end"] - tm["task_start"]}
            if "engine_ready" in tm:
                out["engine_start_s"] = tm["engine_ready"] - tm["engine_launch"]
            if "load_end" in tm:
                out["load_s"] = tm["load_end"] - tm["load_start"]
                out["overhead_s"] = out["total_s"] - out["engine_start_s"] - out["load_s"]
            t.log_metrics(rid, [(f"trial/{k}", v, 0) for k, v in out.items()])

        for name, fn in (("records", records), ("server_metrics", server_metrics), ("configs", configs),
                         ("server_files", server_files), ("findings", findings), ("plots", plots),
                         ("errors", errors), ("timings", timings)):
            try:
                fn()
            except Exception:
                log.exception("could not save %s for trial %s", name, self.ctx.label)
        try:
            t.finish(rid, status)
        except Exception:
            log.exception("could not mark trial %s as %s in MLflow", self.ctx.label, status)


def _short_metrics(m: dict[str, float]) -> str:
    keys = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "achieved_concurrency", "errors", "valid")
    return ", ".join(f"{k}={m[k]:.4g}" for k in keys if k in m)
