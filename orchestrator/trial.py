"""One trial: launch the engine, read its resolved configuration, drive every load point, always
tear down, then summarise, diagnose and log everything to the trial's MLflow run.

Records and telemetry are written to the trial directory as they are produced; MLflow gets them at
the end, also when the trial failed or was interrupted (with its status and the server log tail).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from orchestrator.config.identity import config_hash, resolved_config_dict
from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import typed_config, validate, world_size
from orchestrator.engines.base import HOST
from orchestrator.engines.registry import get_engine
from orchestrator.errors import EngineStartError
from orchestrator.gpu_release import process_group_pids, wait_gpus_free
from orchestrator.load_plan import load_points, request_spec
from orchestrator.process.server import ServerProcess, free_port, http_get_json, log_tail
from orchestrator.progress import ProgressView, ProgressWriter, TrialSlot
from orchestrator.redact import (
    redact_argv,
    redact_mapping,
    redact_override,
    redact_text,
    secret_values,
)
from orchestrator.sweep import ensure_started
from orchestrator.telemetry.server_log import resolved_config, resolved_params, server_log_frame
from orchestrator.telemetry.server_metrics import MetricsScraper, jsonl_to_parquet
from orchestrator.tracking import Tracker, flatten, rate_step

log = logging.getLogger("parasweep")

IN_RAY_ENV = "PARASWEEP_IN_RAY"  # set by the Ray launcher: the driver renders progress, not the trial


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
    overrides = [redact_override(o) for o in hc.overrides.task]  # labels and tags never carry secrets
    num = int(hc.job.num) if hc.job.get("num") is not None else 0
    label = " ".join(overrides) if overrides else "defaults"
    return TrialContext(num, label, overrides, Path(hc.runtime.output_dir).resolve())


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def print_plan(ctx: TrialContext, cfg: ParasweepConf, engine: str, argv: list[str]) -> None:
    gpus = world_size(cfg)
    print(f"trial {ctx.num} [{ctx.label}]: engine={engine} model={cfg.model.name} "
          f"hardware={cfg.hardware.name} tp={cfg.tp.size} pp={cfg.pp.size} ep={cfg.ep.size} "
          f"dp={cfg.dp.size} world_size={gpus} GPUs={gpus}", flush=True)
    print("argv: " + json.dumps(redact_argv(argv)), flush=True)


def run_trial(raw_cfg: DictConfig) -> dict[str, Any]:
    """The Hydra task function body. Returns ``{"status": ok|failed|killed|skipped, "run_id", "timings"}``
    (timings: epoch seconds of task start, engine launch/ready, load start/end, end)."""
    task_start = time.time()
    cfg = typed_config(raw_cfg)
    engine_name = validate(cfg)
    ctx = trial_context()
    engine = get_engine(engine_name)
    engine.preflight(cfg)  # a flag the engine would refuse stops here, before any run is recorded
    port = free_port()
    argv = engine.argv(cfg, port, ctx.trial_dir)
    if cfg.dry_run:
        print_plan(ctx, cfg, engine_name, argv)
        for note in engine.plan_notes(cfg):
            print(note, flush=True)
        return {"status": "skipped", "run_id": None, "timings": {}}

    ctx.trial_dir.mkdir(parents=True, exist_ok=True)
    parent_run_id = cfg.tracking.parent_run_id or ensure_started()  # single runs: this process
    resolved_cfg = resolved_config_dict(cfg, engine_name)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    kind = "prediction" if cfg.predict else "trial"
    run_id = tracker.start_run(
        (cfg.tracking.run_name or f"#{ctx.num} {ctx.label}") + (" (predicted)" if cfg.predict else ""),
        tags={"parasweep.kind": kind, "parasweep.status": "running",
              "parasweep.engine": "sim-predict" if cfg.predict else engine_name,
              "parasweep.config_hash": config_hash(resolved_cfg, engine.version(cfg)),
              "parasweep.trial_num": str(ctx.num),
              "parasweep.overrides": ctx.label, "parasweep.git_sha": git_sha(),
              "parasweep.trial_dir": str(ctx.trial_dir)},
        parent_run_id=parent_run_id)
    tracker.log_params(run_id, flatten(redact_mapping({k: v for k, v in resolved_cfg.items()
                                                       if k != "tracking"})))
    if cfg.reproduce:
        from orchestrator.reproduce import compare_with_original

        tracker.set_tags(run_id, {"parasweep.reproduces": cfg.reproduce})
        new_hash = config_hash(resolved_cfg, engine.version(cfg))
        warning = compare_with_original(tracker, cfg.reproduce, new_hash)
        if warning:
            log.warning("%s", warning)
            print(f"parasweep: warning: {warning}", flush=True)
            tracker.set_tags(run_id, {"parasweep.reproduce_warning": warning})

    progress = ProgressWriter(ctx.trial_dir, ctx.label)
    own_view = (ProgressView([TrialSlot(ctx.trial_dir, ctx.label, "running")])
                if not os.environ.get(IN_RAY_ENV) else contextlib.nullcontext())
    trial = _TrialRun(cfg, ctx, engine_name, argv, port, tracker, run_id, progress)
    trial.timings["task_start"] = task_start
    if cfg.predict:
        status = trial.predict()
        return {"status": status, "run_id": run_id, "timings": trial.timings}
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
        self.secrets = secret_values(asdict(cfg))  # scrubbed from logs and messages we upload

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

    def predict(self) -> str:
        """The same trial in the simulator's virtual time: nothing is launched, the same metrics,
        diagnosis are logged (run tagged ``parasweep.kind=prediction``)."""
        from orchestrator.engines.sim import SimEngine
        from simulator.predict import predict_trial, resolved_server_info

        status = "failed"
        try:
            sim = SimEngine()
            sim.prepare(self.cfg, self.ctx.trial_dir)
            argv = sim.argv(self.cfg, self.port, self.ctx.trial_dir)[3:]  # without `python -m simulator`
            self._use_server_info(resolved_server_info(argv))
            points = load_points(self.cfg)
            results = predict_trial(argv, points, request_spec(self.cfg))
            self.records_jsonl.parent.mkdir(parents=True, exist_ok=True)
            with self.records_jsonl.open("w") as f:
                for result in results:
                    f.writelines(json.dumps(asdict(r)) + "\n" for r in result.records)
            for point, result in zip(points, results, strict=True):
                # virtual seconds: the point's window on the simulated clock
                times = [r.send_time for r in result.records] + [r.end_time for r in result.records]
                outcome = PointOutcome(point.label, point.concurrency, point.rate, min(times), max(times),
                                       dict(result.metrics), list(result.invalid_reasons))
                self.outcomes.append(outcome)
                self._log_point(outcome)
            status = "ok"
        except KeyboardInterrupt:
            status, self.error = "killed", "interrupted"
            raise
        except Exception:
            self.error = traceback.format_exc()
        finally:
            self._finalize(status)
        return status

    def _measure(self) -> None:
        cfg, d = self.cfg, self.ctx.trial_dir
        engine = get_engine(self.engine_name)
        engine.prepare(cfg, d)
        (d / "server").mkdir(parents=True, exist_ok=True)
        self.progress.update(status="starting engine", force=True)
        env = dict(os.environ)  # CUDA_VISIBLE_DEVICES as Ray assigned it reaches the engine
        self.tracker.set_tags(self.run_id, {
            "parasweep.cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", "")})
        self.timings["engine_launch"] = time.time()
        pids: set[int] = set()
        try:
            server = self._start_engine(engine, env)  # started and ready
            try:
                self.timings["engine_ready"] = time.time()
                pids = process_group_pids(server.pid or 0)
                self._drive_load(server)
            finally:
                server.stop()
        finally:
            if self.engine_name == "sglang":  # the next trial on these GPUs needs their memory back
                for warning in wait_gpus_free(env.get("CUDA_VISIBLE_DEVICES"), 60.0, pids or None):
                    log.warning("%s", warning)
        self.timings["engine_stopped"] = time.time()

    def _drive_load(self, server: ServerProcess) -> None:
        from workloads import run_point

        cfg = self.cfg
        self._read_server_info(server.url)
        spec = request_spec(cfg)
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

    def _start_engine(self, engine: Any, env: dict[str, str], attempts: int = 3) -> ServerProcess:
        """A ready engine. A free port can be taken by another trial between our probe and the engine's
        bind (trials start side by side): then try another port, up to ``attempts`` times."""
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                self.port = free_port()
                self.argv = engine.argv(self.cfg, self.port, self.ctx.trial_dir)
            (self.ctx.trial_dir / "server" / "argv.json").write_text(
                json.dumps(redact_argv(self.argv), indent=1))
            server = ServerProcess(self.argv, self.server_log, HOST, self.port, env=env,
                                   stop_grace_s=self.cfg.engine.stop_grace_s)
            try:
                server.start()
                server.wait_ready(self.cfg.engine.startup_timeout_s)
                return server
            except EngineStartError as exc:
                server.stop()
                if attempt == attempts or "address already in use" not in str(exc).lower():
                    raise
                log.warning("port %d was taken before the engine bound it; retrying", self.port)
            except BaseException:
                server.stop()
                raise
        raise AssertionError("unreachable")

    def _read_server_info(self, url: str) -> None:
        self._use_server_info(http_get_json(url + "/server_info"))

    def _use_server_info(self, info: dict[str, Any]) -> None:
        self.server_info = info
        path = self.ctx.trial_dir / "server" / "server_info.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(redact_mapping(self.server_info), indent=1))
        # /server_info, completed by the startup log (CUDA-graph sizes, per-stage limits, backend)
        log_text = self.server_log.read_text(errors="replace") if self.server_log.exists() else ""
        self.resolved = resolved_config(info, log_text)
        self.tracker.log_params(self.run_id, resolved_params(redact_mapping(self.resolved)))
        version = self.server_info.get("version", "unknown")
        engine_tag = self.server_info.get("engine")
        self.tracker.set_tags(self.run_id, {
            "parasweep.engine_version": f"{engine_tag} {version}" if engine_tag else str(version)})

    def _log_point(self, o: PointOutcome) -> None:
        step = o.concurrency if o.concurrency is not None else rate_step(o.rate or 0.0)
        series = "" if o.concurrency is not None else "open/"
        batch = []
        for key, value in o.metrics.items():
            if isinstance(value, bool | int | float):
                batch.append((f"{o.label}/{key}", float(value), 0))
                batch.append((f"{series}{key}", float(value), step))
        self.tracker.log_metrics(self.run_id, batch)

    def _finalize(self, status: str) -> None:
        """Log artifacts, telemetry summaries and diagnosis; never raise. (Plots are drawn by the
        driver once the sweep ends: see orchestrator/cli.py.)"""
        from analysis.diagnose import TrialFacts, diagnose
        from analysis.telemetry import point_telemetry

        d, t, rid = self.ctx.trial_dir, self.tracker, self.run_id
        self.error = redact_text(self.error, self.secrets)
        telemetry: dict[str, Any] = {}

        def records() -> None:
            if self.records_jsonl.exists():
                from workloads import read_records, records_to_dataframe

                df = records_to_dataframe(list(read_records(self.records_jsonl)))
                df.to_parquet(d / "records" / "requests.parquet", index=False)
                t.log_artifact(rid, d / "records" / "requests.parquet", "records")

        def server_log() -> None:  # per-stage batch lines (running-req, queue-req, token usage, ...)
            frame = server_log_frame(self.server_log) if self.server_log.exists() else None
            if frame is not None and not frame.empty:
                (d / "telemetry").mkdir(parents=True, exist_ok=True)
                frame.to_parquet(d / "telemetry" / "server_log.parquet", index=False)

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
            (cfg_dir / "resolved.yaml").write_text(yaml.safe_dump(
                redact_mapping(resolved_config_dict(self.cfg, self.engine_name)), sort_keys=False))
            (cfg_dir / "overrides.yaml").write_text(yaml.safe_dump(self.ctx.overrides))
            t.log_artifact(rid, cfg_dir / "resolved.yaml", "config")
            t.log_artifact(rid, cfg_dir / "overrides.yaml", "config")

        def server_files() -> None:
            for name in ("server_info.json", "argv.json"):
                t.log_artifact(rid, d / "server" / name, "server")
            if self.secrets and self.server_log.exists():  # the engine may echo its arguments
                upload = d / "server" / "redacted" / "server.log"
                upload.parent.mkdir(parents=True, exist_ok=True)
                upload.write_text(redact_text(self.server_log.read_text(errors="replace"), self.secrets))
                t.log_artifact(rid, upload, "server")
            else:
                t.log_artifact(rid, self.server_log, "server")

        def findings() -> None:
            facts = TrialFacts(
                pp_size=self.cfg.pp.size, async_depth=self.cfg.pp.async_depth, resolved=self.resolved,
                points={o.label: {**o.metrics, "invalid_reason": "; ".join(o.invalid_reasons)}
                        for o in self.outcomes},
                concurrency={o.label: o.concurrency for o in self.outcomes if o.concurrency is not None},
                idle_power_w=self.cfg.hardware.idle_power_w, power_limit_w=self.cfg.hardware.power_limit_w)
            result = [f.to_dict() for f in diagnose(facts)]
            if status != "ok" and self.error:
                result.insert(0, {"id": "trial_failed", "severity": "critical",
                                  "title": f"Trial {status}", "evidence": self.error[-4000:],
                                  "suggestion": "See server/server.log; tail:\n" + redact_text(
                                      log_tail(self.server_log), self.secrets)})
            (d / "diagnosis.json").write_text(json.dumps(result, indent=1))
            t.log_artifact(rid, d / "diagnosis.json")

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

        def note() -> None:  # what the MLflow UI shows as the run's description
            c = self.cfg
            lines = [f"**{status}**: {self.ctx.label}", "",
                     f"{c.model.name} on {c.hardware.name}, tp={c.tp.size} pp={c.pp.size} ep={c.ep.size} "
                     f"dp={c.dp.size}, async depth {c.pp.async_depth}, engine {self.engine_name}", ""]
            if self.outcomes:
                lines += ["| point | output tok/s | TTFT p99 ms | ITL p99 ms | valid |",
                          "|---|---|---|---|---|"]
                for o in self.outcomes:
                    m = o.metrics
                    lines.append(f"| {o.label} | {m.get('output_tok_s', float('nan')):.1f} | "
                                 f"{m.get('ttft_p99_ms', float('nan')):.1f} | "
                                 f"{m.get('itl_p99_ms', float('nan')):.2f} | {int(m.get('valid', 1))} |")
            diagnosis = d / "diagnosis.json"
            findings = json.loads(diagnosis.read_text()) if diagnosis.exists() else []
            if findings:
                lines += ["", "Findings (diagnosis.json):"]
                lines += [f"- **{f['severity']}** {f['title']}: {f['suggestion'].splitlines()[0]}"
                          for f in findings]
            t.set_tags(rid, {"mlflow.note.content": "\n".join(lines)[:7900]})

        steps = (("records", records), ("server_log", server_log), ("server_metrics", server_metrics),
                 ("configs", configs), ("server_files", server_files), ("findings", findings),
                 ("errors", errors), ("timings", timings), ("note", note))
        for name, fn in steps:
            began = time.perf_counter()
            try:
                fn()
            except Exception:
                log.exception("could not save %s for trial %s", name, self.ctx.label)
            self.timings[f"finalize_{name}_s"] = time.perf_counter() - began
        try:
            t.finish(rid, status)
        except Exception:
            log.exception("could not mark trial %s as %s in MLflow", self.ctx.label, status)


def _short_metrics(m: dict[str, float]) -> str:
    keys = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "achieved_concurrency", "errors", "valid")
    return ", ".join(f"{k}={m[k]:.4g}" for k in keys if k in m)
