"""Stage 4, *recorder*: the one door to the trial directory and to the trial's MLflow run.

Everything a trial keeps passes through here, and secrets are taken out here, once: the config's
secret-named values, passwords in URLs and flags such as ``--api-key`` become ``***`` in params, tags,
run names and uploaded files. The trial directory keeps the originals (the engine's own log, the
request records): they are the user's files. Records and telemetry are written to the directory as
they are produced; MLflow gets them when the trial ends, whatever its status.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.environment import ENV_FILE
from orchestrator.process.server import log_tail
from orchestrator.redact import redact_argv, redact_mapping, redact_text, secret_values
from orchestrator.store.tracking import Tracker, config_params
from orchestrator.telemetry.server_log import resolved_params
from vocab.findings import Finding
from vocab.metric_keys import MetricKey
from vocab.records import PointResult
from vocab.status import RunKind, Tag, TrialStatus

log = logging.getLogger("parasweep")


@dataclass(frozen=True)
class TrialPaths:
    """The layout of one trial directory."""

    root: Path

    @property
    def server_log(self) -> Path:
        return self.root / "server" / "server.log"

    def replica_log(self, rank: int) -> Path:
        """Behind the router package, DP replica ``rank``'s log (replica 0's is ``server_log``)."""
        return self.server_log if rank == 0 else self.server_log.with_name(f"server-dp{rank}.log")

    def worker_log(self, role: str, index: int) -> Path:
        """A disaggregated trial's server ``index`` of ``role`` (decode server 0's is ``server_log``: the
        engine's log, which everything read from the engine's log reads)."""
        if role == "decode" and index == 0:
            return self.server_log
        return self.server_log.with_name(f"server-{role}{index}.log")

    def worker_metrics_jsonl(self, role: str, index: int) -> Path:
        """A disaggregated trial's server ``index`` of ``role``'s ``/metrics`` (decode server 0's is
        ``server_metrics_jsonl``)."""
        if role == "decode" and index == 0:
            return self.server_metrics_jsonl
        return self.server_metrics_jsonl.with_name(f"server_metrics-{role}{index}.jsonl")

    @property
    def router_log(self) -> Path:
        return self.server_log.with_name("router.log")

    @property
    def records_jsonl(self) -> Path:
        return self.root / "records" / "requests.jsonl"

    @property
    def server_metrics_jsonl(self) -> Path:
        return self.root / "telemetry" / "server_metrics.jsonl"

    def replica_metrics_jsonl(self, rank: int) -> Path:
        """Behind the router package, DP replica ``rank``'s ``/metrics`` (replica 0's is
        ``server_metrics_jsonl``)."""
        if rank == 0:
            return self.server_metrics_jsonl
        return self.server_metrics_jsonl.with_name(f"server_metrics-dp{rank}.jsonl")

    @property
    def router_metrics_jsonl(self) -> Path:
        return self.server_metrics_jsonl.with_name("router_metrics.jsonl")

    @property
    def gpu_jsonl(self) -> Path:
        return self.root / "telemetry" / "gpu.jsonl"

    @property
    def reproduction(self) -> Path:
        """The side-by-side of a reproduced trial and its original (``reproduce=``)."""
        return self.root / "reproduction.txt"

    @property
    def point_windows(self) -> Path:
        """Each load point's measured window on the records' clock (for pictures of the series)."""
        return self.root / "telemetry" / "point_windows.json"

    def read_server_log(self) -> str:
        return self.server_log.read_text(errors="replace") if self.server_log.exists() else ""


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


class TrialRecorder:
    """Opens the trial's run, logs what the trial produces, closes the run with its status."""

    def __init__(self, tracker: Tracker, paths: TrialPaths, config: dict[str, Any]) -> None:
        self.tracker, self.paths = tracker, paths
        self.secrets = secret_values(config)  # scrubbed from free text (logs, errors) we upload
        self.run_id = ""

    # -- the run -----------------------------------------------------------------------------------
    def open(self, name: str, kind: RunKind, tags: dict[str, str], params: dict[str, Any],
             parent_run_id: str | None) -> str:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        all_tags = {Tag.KIND: kind.value, Tag.STATUS: TrialStatus.RUNNING.value, Tag.GIT_SHA: git_sha(),
                    Tag.TRIAL_DIR: str(self.paths.root), **tags}
        self.run_id = self.tracker.start_run(self._text(name), tags=self._tags(all_tags),
                                             parent_run_id=parent_run_id)
        self.tracker.log_params(self.run_id, config_params(redact_mapping(params)))
        return self.run_id

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tracker.set_tags(self.run_id, self._tags(tags))

    def close(self, status: TrialStatus) -> None:
        self.tracker.finish(self.run_id, status.value)

    # -- what the engine said ----------------------------------------------------------------------
    def save_argv(self, argv: list[str], router_argv: list[str] | None = None) -> None:
        """The server command (the last one tried, also when the engine did not start); behind a
        router, replica 0's, and the router's beside it."""
        for name, command in (("argv.json", argv), ("router_argv.json", router_argv)):
            if command:
                (self.paths.root / "server").mkdir(parents=True, exist_ok=True)
                (self.paths.root / "server" / name).write_text(json.dumps(redact_argv(command), indent=1))

    def record_engine(self, server_info: dict[str, Any], resolved: dict[str, Any], version: str) -> None:
        """What the ready engine reports: /server_info, its resolved values, its version."""
        (self.paths.root / "server").mkdir(parents=True, exist_ok=True)
        (self.paths.root / "server" / "server_info.json").write_text(
            json.dumps(redact_mapping(server_info), indent=1))
        self.tracker.log_params(self.run_id, resolved_params(redact_mapping(resolved)))
        self.set_tags({Tag.ENGINE_VERSION: version})

    # -- metrics -----------------------------------------------------------------------------------
    def log_point(self, result: PointResult) -> None:
        """A point's metrics as ``<point>/<metric>`` and as the step series charted against load."""
        label = result.point.point_label
        batch = []
        for name, value in result.metrics.items():
            if isinstance(value, bool | int | float):
                series, step = MetricKey.series(label, name)
                batch += [(str(MetricKey(name, label)), float(value), 0), (str(series), float(value), step)]
        self.tracker.log_metrics(self.run_id, batch)

    def log_point_extras(self, extras: dict[str, dict[str, float]]) -> None:
        """Per-point summaries computed after the load (telemetry), keyed by point label."""
        self.tracker.log_metrics(self.run_id, [(str(MetricKey.at(label, name)), value, 0)
                                               for label, metrics in extras.items()
                                               for name, value in metrics.items()])

    def log_timings(self, timings: dict[str, float]) -> None:
        self.tracker.log_metrics(self.run_id, [(str(MetricKey(k, prefix="trial")), v, 0)
                                               for k, v in timings.items()])

    # -- files -------------------------------------------------------------------------------------
    def save_records(self) -> None:
        if self.paths.records_jsonl.exists():
            from vocab.records import read_records, records_to_dataframe

            out = self.paths.root / "records" / "requests.parquet"
            records_to_dataframe(list(read_records(self.paths.records_jsonl))).to_parquet(out, index=False)
            self.tracker.log_artifact(self.run_id, out, "records")

    def save_telemetry(self, frames: dict[str, Any]) -> None:
        """``{name: DataFrame}`` -> ``telemetry/<name>.parquet``, logged."""
        folder = self.paths.root / "telemetry"
        for name, frame in frames.items():
            if frame is None or frame.empty:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            frame.to_parquet(folder / f"{name}.parquet", index=False)
            self.tracker.log_artifact(self.run_id, folder / f"{name}.parquet", "telemetry")

    def save_point_windows(self, windows: dict[str, tuple[float, float]]) -> None:
        if windows:
            self.paths.point_windows.parent.mkdir(parents=True, exist_ok=True)
            self.paths.point_windows.write_text(json.dumps(windows, indent=1))
            self.tracker.log_artifact(self.run_id, self.paths.point_windows, "telemetry")

    def save_config(self, resolved_cfg: dict[str, Any], overrides: Iterable[str]) -> None:
        folder = self.paths.root / "config"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "resolved.yaml").write_text(yaml.safe_dump(redact_mapping(resolved_cfg), sort_keys=False))
        (folder / "overrides.yaml").write_text(yaml.safe_dump([self._text(o) for o in overrides]))
        for name in ("resolved.yaml", "overrides.yaml"):
            self.tracker.log_artifact(self.run_id, folder / name, "config")

    def save_env(self, env: dict[str, Any]) -> None:
        """``env.json``: the environment fingerprint (orchestrator/environment.py), which a
        reproduction compares with its own."""
        (self.paths.root / ENV_FILE).write_text(json.dumps(redact_mapping(env), indent=1))
        self.tracker.log_artifact(self.run_id, self.paths.root / ENV_FILE)

    def save_server_files(self) -> None:
        server = self.paths.root / "server"
        router = ["router_argv.json"] if (server / "router_argv.json").exists() else []
        for name in ("server_info.json", "argv.json", *router):
            self.tracker.log_artifact(self.run_id, server / name, "server")
        # rank 0's log, across nodes the other nodes' (server-node<r>.log), behind a router the other
        # replicas' (server-dp<i>.log) and the router's; the engine may echo its arguments: upload a
        # redacted copy
        for log in sorted([*server.glob("server*.log"), *server.glob(self.paths.router_log.name)]):
            upload = server / "redacted" / log.name
            upload.parent.mkdir(parents=True, exist_ok=True)
            upload.write_text(self._text(log.read_text(errors="replace")))
            self.tracker.log_artifact(self.run_id, upload, "server")

    def save_findings(self, findings: list[Finding], status: TrialStatus, error: str) -> list[dict[str, Any]]:
        """``diagnosis.json``: the rules' findings, led by the failure itself when the trial failed."""
        result = [f.to_dict() for f in findings]
        if status is not TrialStatus.OK and error:
            tail = self._text(log_tail(self.paths.server_log))
            failure = Finding("trial_failed", "critical", f"Trial {status.value}", self._text(error)[-4000:],
                              "See server/server.log; tail:\n" + tail)
            result.insert(0, failure.to_dict())
        (self.paths.root / "diagnosis.json").write_text(json.dumps(result, indent=1))
        self.tracker.log_artifact(self.run_id, self.paths.root / "diagnosis.json")
        return result

    def save_error(self, error: str) -> None:
        if error:
            text = self._text(error)
            self.set_tags({Tag.ERROR: text[-2000:]})
            (self.paths.root / "error.txt").write_text(text)
            self.tracker.log_artifact(self.run_id, self.paths.root / "error.txt")

    def save_reproduction(self, lines: list[str]) -> None:
        """The original and this run side by side: kept, uploaded, its first line in a tag."""
        self.paths.reproduction.write_text(self._text("\n".join(lines) + "\n"))
        self.tracker.log_artifact(self.run_id, self.paths.reproduction)
        self.set_tags({Tag.REPRODUCE_DIFF: lines[0]})

    def describe(self, lines: list[str]) -> None:
        """The run's description in the MLflow UI (Markdown)."""
        self.set_tags({Tag.NOTE: self._text("\n".join(lines))[:7900]})

    # -- redaction, once, at the door ----------------------------------------------------------------
    def _text(self, text: str) -> str:
        return redact_text(text, self.secrets)

    def _tags(self, tags: dict[str, str]) -> dict[str, str]:
        return {k: self._text(str(v)) for k, v in redact_mapping(tags).items()}


def run_steps(steps: list[tuple[str, Callable[[], None]]], timings: dict[str, float], what: str) -> None:
    """Run each end-of-trial step even when an earlier one failed (each keeps something the others do
    not need); a failure is logged, never raised, so the run is still closed with its status."""
    for name, fn in steps:
        began = time.perf_counter()
        try:
            fn()
        except Exception:
            log.exception("could not save %s for trial %s", name, what)
        timings[f"finalize_{name}_s"] = time.perf_counter() - began


def config_tags(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """The config as params: everything but the tracking settings (which say where, not what)."""
    return {k: v for k, v in cfg_dict.items() if k != "tracking"}

