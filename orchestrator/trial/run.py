"""One trial as a short composition of its stages::

    plan ──► recorder.open ──► engine session ──► load driver ──► analysis ──► recorder.close
             (MLflow run)      (live or virtual)   (points)       (telemetry summaries, findings)

Every stage takes and returns plain typed values (see ARCHITECTURE.md), so each is tested on its own
without Hydra. Whatever happens in the middle, the end always runs: what exists is summarised,
diagnosed and logged, and the run is closed with the trial's status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.schema import PD_ROLES, plays_vllm, role_gpus, world_size
from orchestrator.config.traffic import traffic_note
from orchestrator.environment import engine_version, joined_placement, placement
from orchestrator.errors import EngineFailure, EngineStartError
from orchestrator.fidelity.trust import bands_text
from orchestrator.points.virtual import budget_hits
from orchestrator.prediction.modelled import step_costs_label, with_measured_acceptance
from orchestrator.progress import ProgressView, ProgressWriter, TrialSlot
from orchestrator.store.tracking import Tracker
from orchestrator.trial.load_driver import drive_load
from orchestrator.trial.plan import TrialPlan
from orchestrator.trial.recorder import TrialPaths, TrialRecorder, config_tags, run_steps
from orchestrator.trial.session import EngineSession, LiveSession, VirtualSession
from vocab.findings import Finding
from vocab.records import PointResult
from vocab.status import PLACEMENT_TAGS, RunKind, Tag, TrialStatus, simulated
from vocab.telemetry import SPEC_ACCEPT_LEN, GpuPlace, engine_layout

log = logging.getLogger("parasweep")


@dataclass
class TrialRunSettings:
    """Where and how a trial records itself (sweep-wide settings, the same for every trial)."""

    tracking_uri: str | None
    experiment: str
    parent_run_id: str | None = None
    reproduces: str | None = None  # the run id this trial re-runs (reproduce=)
    own_progress_view: bool = True  # False under the Ray launcher: the driver renders progress
    # the sweep's cache of predictions, shared by its trials' diagnoses and its end (None: no cache)
    predictions_dir: Path | None = None


@dataclass
class TrialOutcome:
    status: TrialStatus
    run_id: str | None
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def as_job_return(self) -> dict[str, Any]:
        """What the Hydra task function returns (the launcher reads it back)."""
        return {"status": self.status.value, "run_id": self.run_id, "timings": self.timings}


def _let_go_of_an_interrupted_write(exc: BaseException) -> None:
    """Drop what the interrupt's traceback holds, so the store can be written again.

    An interrupt that lands inside a write to a SQLite store leaves that write's statement referenced
    from the traceback's frames. SQLAlchemy closes the connection, but SQLite cannot close it while the
    statement lives, and it keeps the database locked: the trial's closing writes would each wait out
    the busy timeout (20 s; about 110 s in all) and fail, leaving the run ``running``. Re-raising needs
    the traceback, not the finished frames' locals."""
    traceback.clear_frames(exc.__traceback__)


def execute_trial(plan: TrialPlan, settings: TrialRunSettings,
                  task_start: float | None = None) -> TrialOutcome:
    cfg, ident = plan.cfg, plan.identity
    paths = TrialPaths(ident.trial_dir)
    virtual = cfg.predict
    recorder = TrialRecorder(Tracker(settings.tracking_uri, settings.experiment), paths, plan.resolved_cfg)
    tags = {Tag.ENGINE: "sim-predict" if virtual else plan.engine_name,
            Tag.ENGINE_REASON: "predict=true" if virtual else (cfg.tracking.engine_reason
                                                               or f"engine={plan.engine_name}"),
            **({Tag.SIM_TIME_SCALE: f"{cfg.engine.time_scale:g}"}
               if simulated(plan.engine_name) and not virtual and cfg.engine.time_scale != 1.0 else {}),
            Tag.CONFIG_HASH: plan.config_hash,
            Tag.TRIAL_NUM: str(ident.num), Tag.OVERRIDES: ident.label,
            Tag.STEP_COSTS: step_costs_label(cfg),
            **({Tag.PREDICTION_ERROR: text} if (text := bands_text(cfg)) else {}),
            **({Tag.TRAFFIC: traffic_note(cfg)} if cfg.workload.source != "random" else {})}
    run_id = recorder.open(ident.run_name + (" (predicted)" if virtual else ""),
                           RunKind.PREDICTION if virtual else RunKind.TRIAL, tags,
                           config_tags(plan.resolved_cfg), settings.parent_run_id)
    if settings.reproduces:
        _check_reproduction(recorder, settings.reproduces, plan.config_hash)

    timings: dict[str, float] = {"task_start": task_start or time.time()}
    progress = ProgressWriter(ident.trial_dir, ident.label)
    session: EngineSession = VirtualSession(plan) if virtual else LiveSession(plan, paths)
    results: list[PointResult] = []
    where: dict[str, str] = {}  # where it ran (not for a prediction: it runs nowhere)
    status, error = TrialStatus.FAILED, ""
    view = (ProgressView([TrialSlot(ident.trial_dir, ident.label, "running")])
            if settings.own_progress_view and not virtual else contextlib.nullcontext())
    try:
        with view:
            if not virtual:
                # the GPUs Ray assigned (LiveSession hands this environment to the engine), and where
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                where = placement(plan.engine_name, visible)
                recorder.set_tags({Tag.CUDA_VISIBLE_DEVICES: visible or "", **_placement_tags(where)})
                progress.update(status="starting engine", force=True)
            with session:
                recorder.record_engine(session.server_info, session.resolved,
                                       engine_version(session.server_info))
                timings["load_start"] = time.time()

                def on_point(result: PointResult) -> None:
                    # kept as each point ends, so a point cut short still reaches the summary
                    results.append(result)
                    recorder.log_point(result)

                drive_load(session, plan.points, plan.spec, paths.records_jsonl, progress, on_point)
                timings["load_end"] = time.time()
                hit = budget_hits(results)
                if hit:
                    recorder.set_tags({Tag.BUDGET_HIT: ",".join(hit)})
        status = TrialStatus.OK
    except KeyboardInterrupt as exc:  # Ctrl-C in a single run, or Ray's soft cancel of this task
        status, error = TrialStatus.KILLED, "interrupted"
        _let_go_of_an_interrupted_write(exc)
        raise
    except SystemExit as exc:  # Ray ends a worker this way when its raylet is gone (the driver was killed)
        status, error = TrialStatus.KILLED, "its worker was ended (the sweep's driver or Ray went away)"
        _let_go_of_an_interrupted_write(exc)
        raise
    except (EngineStartError, EngineFailure) as exc:  # the message says it all: no traceback
        error = str(exc)
    except Exception:
        error = traceback.format_exc()
    finally:
        where = _every_node(recorder, where, session)
        timings.update(session.timings)
        recorder.save_argv(session.argv, session.router_argv)
        progress.update(status=status.value, message=error.splitlines()[0] if error else "", force=True)
        _finish(plan, recorder, session, results, status, error, timings, settings, where)
    return TrialOutcome(status, run_id, timings, error)


def _every_node(recorder: TrialRecorder, where: dict[str, str], session: EngineSession) -> dict[str, str]:
    """Across nodes, where the trial ran is every node, rank 0 first (known once the others started,
    whether or not the trial then went well): recorded in the tags, and returned for env.json.
    Otherwise ``where`` as it is."""
    others = session.other_node_places
    if not where or not others:
        return where
    joined = joined_placement([where, *others])
    recorder.set_tags(_placement_tags(joined))
    return joined


def _placement_tags(where: dict[str, str]) -> dict[str, str]:
    return {tag: where[key] for key, tag in PLACEMENT_TAGS.items()}


def _check_reproduction(recorder: TrialRecorder, original: str, new_hash: str) -> None:
    from orchestrator.reproduce import compare_with_original

    recorder.set_tags({Tag.REPRODUCES: original})
    warning = compare_with_original(recorder.tracker, original, new_hash)
    if warning:
        log.warning("%s", warning)
        print(f"parasweep: warning: {warning}", flush=True)
        recorder.set_tags({Tag.REPRODUCE_WARNING: warning})


def with_placement(samples: Any, layout: list[GpuPlace]) -> Any:
    """GPU samples with the (dp, pp, tp) rank of each GPU as the engine lays them out, so the Parquet
    file can be grouped by pipeline stage without knowing the layout rule."""
    if samples is None:
        return None
    place = {p.gpu: p for p in layout}
    for rank in ("dp", "pp", "tp"):
        samples[rank] = [getattr(place[g], rank) if g in place else -1 for g in samples["gpu"].astype(int)]
    return samples


def _finish(plan: TrialPlan, recorder: TrialRecorder, session: EngineSession, results: list[PointResult],
            status: TrialStatus, error: str, timings: dict[str, float],
            settings: TrialRunSettings, where: dict[str, str] | None = None) -> None:
    """Summarise, diagnose and log what exists; never raise. The order is explicit: each step takes
    what it needs as arguments (telemetry summaries feed the diagnosis, which feeds the description)."""
    from analysis.diagnose import diagnose
    from analysis.dp_balance import balance_summary
    from analysis.dp_routing import routing_summary
    from analysis.pd_stages import role_busy, stage_parts, transfer_size
    from analysis.telemetry import point_telemetry
    from orchestrator.engines.router import worker_urls
    from orchestrator.environment import fingerprint
    from orchestrator.telemetry.gpu_sampler import read_gpu_samples
    from orchestrator.telemetry.server_metrics import read_samples
    from orchestrator.telemetry.stage_series import stage_frame
    from orchestrator.trial.advice import check_findings
    from orchestrator.trial.summary import describe_trial, measured_window, trial_facts, trial_timings

    paths, cfg, gpu = recorder.paths, plan.cfg, session.gpu
    frames: dict[str, Any] = {}
    extras: dict[str, dict[str, float]] = {}
    findings: list[Finding] = []
    # a disaggregated trial's GPUs are several servers', none of them the trial's own layout: no stages
    layout = engine_layout(cfg.tp.size, cfg.pp.size, cfg.dp.size) if not cfg.pd.enabled else []

    def telemetry() -> None:
        recorder.set_tags({Tag.GPU_TELEMETRY: gpu.source.value, Tag.GPU_TELEMETRY_NOTE: gpu.note})
        if cfg.predict:  # virtual time: the prediction's metrics already carry the summaries
            return
        metrics = frames["server_metrics"] = read_samples(paths.server_metrics_jsonl)
        log_rows = frames["server_log"] = (plan.engine.log_frame(paths.server_log)
                                           if paths.server_log.exists() else None)
        # SGLang's log has a line per batch, the first source of the scheduler series; vLLM's a stats line
        # every 10 s, which stands in only where /metrics has nothing
        periodic = not plan.engine.batch_log and metrics is not None and not metrics.empty
        stages = frames["stage_series"] = stage_frame(None if periodic else log_rows, metrics)
        samples = frames["gpu"] = with_placement(read_gpu_samples(paths.gpu_jsonl), layout)
        # behind the router package: its own scrapes and the other replicas', saved beside replica 0's
        urls = worker_urls(session.router_argv)
        router = frames["router_metrics"] = read_samples(paths.router_metrics_jsonl) if urls else None
        replicas = [metrics]
        for i in range(1, len(urls)):
            replicas.append(read_samples(paths.replica_metrics_jsonl(i)))
            frames[paths.replica_metrics_jsonl(i).stem] = replicas[-1]
        by_role: dict[str, list[Any]] = {role: [] for role in PD_ROLES}
        if cfg.pd.enabled:  # the router's own PD metrics (smg_pd_*), and every other server's scrape
            frames["router_metrics"] = read_samples(paths.router_metrics_jsonl)
            for role in PD_ROLES:
                for i in range(getattr(cfg.pd, role).workers):
                    path = paths.worker_metrics_jsonl(role, i)
                    if path != paths.server_metrics_jsonl:
                        frames[path.stem] = read_samples(path)
                    by_role[role].append(metrics if path == paths.server_metrics_jsonl else frames[path.stem])
        recorder.save_telemetry(frames)
        windows = {r.point.label: measured_window(r) for r in results}
        recorder.save_point_windows(windows)
        for r in results:
            start, end = windows[r.point.label]
            extra = point_telemetry(samples, stages, start, end, int(r.metrics.get("output_tokens", 0)),
                                    cfg.hardware.idle_power_w, layout)
            extra.update(balance_summary(metrics, start, end))  # attention-DP ranks: SGLang's balance series
            if urls:  # DP replicas behind the router package: how it spread them, what each cache found
                extra.update(routing_summary(router, replicas, urls, start, end))
            if cfg.pd.enabled:  # the TTFT's parts from the servers' histograms, each role's GPUs' busy share
                extra.update(stage_parts(by_role, start, end, plays_vllm(cfg)))
                extra.update(transfer_size(by_role, start, end, plays_vllm(cfg)))
                extra.update(role_busy(extra, role_gpus(cfg, "prefill") * cfg.pd.prefill.workers,
                                       world_size(cfg)))
            if extra:
                extras[r.point.label] = extra
        recorder.log_point_extras(extras)

    def diagnosis() -> None:
        facts = trial_facts(cfg, session.resolved, results, extras, gpu.source,
                            "sim-predict" if cfg.predict else plan.engine_name)
        # a speculative trial's changes are predicted with the accept length it measured
        measured = [float(e.get(SPEC_ACCEPT_LEN, float("nan"))) for e in extras.values()]
        advised = with_measured_acceptance(cfg, session.resolved, measured)
        findings.extend(check_findings(diagnose(facts), advised, plan.points, settings.predictions_dir))

    def environment() -> None:
        engine = "sim-predict" if cfg.predict else plan.engine_name
        recorder.save_env(fingerprint(engine, session.server_info, cfg.hardware.name,
                                      os.environ.get("CUDA_VISIBLE_DEVICES"), where or None))

    def reproduction() -> None:
        """The original and this run side by side (reproduce=): printed and recorded."""
        from orchestrator.reproduce import reproduction_report

        if not settings.reproduces:
            return
        lines = reproduction_report(recorder.tracker, settings.reproduces, recorder.run_id)
        print("\n".join(lines), flush=True)
        recorder.save_reproduction(lines)

    saved: list[dict[str, Any]] = []
    steps = [("records", recorder.save_records), ("telemetry", telemetry),
             ("config", lambda: recorder.save_config(plan.resolved_cfg, plan.identity.overrides)),
             ("environment", environment),
             ("server_files", recorder.save_server_files), ("diagnosis", diagnosis),
             ("findings", lambda: saved.extend(recorder.save_findings(findings, status, error))),
             ("reproduction", reproduction),
             ("error", lambda: recorder.save_error(error)),
             ("timings", lambda: recorder.log_timings(trial_timings({**timings, "end": time.time()}))),
             ("description", lambda: recorder.describe(
                 describe_trial(plan, status, results, extras, saved, gpu.source, gpu.note,
                                where or {})))]
    run_steps(steps, timings, plan.identity.label)
    try:
        recorder.close(status)
    except Exception:
        log.exception("could not mark trial %s as %s in MLflow", plan.identity.label, status.value)
