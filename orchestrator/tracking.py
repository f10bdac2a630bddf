"""The MLflow store (layout: docs/mlflow-layout.md): a parent run per sweep, a child run per trial.

Everything goes through ``MlflowClient`` with explicit run ids (no fluent global state), because
trials run in Ray worker processes, several at a time, against the same store.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from analysis.store import StoreError, checked_store
from orchestrator.errors import ConfigError
from orchestrator.paths import default_tracking_uri
from vocab.status import Tag

_MLFLOW_STATUS = {"ok": "FINISHED", "skipped": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
MAX_PARAM_LEN = 6000  # longer values are truncated by MLflow; keep big blobs as artifacts


def tracking_uri(uri: str | None) -> str:
    return uri or default_tracking_uri()


VALID_URIS = "a reachable MLflow tracking server URL, or null for runs/mlflow.db"


def check_store(uri: str) -> None:
    """Refuse, in one line, a store the sweep could not write, before anything launches: an http(s)
    server that does not accept a connection (MLflow's client would retry it for minutes, silently),
    or a sqlite file that cannot be created or written. A sqlite file that does not exist yet is fine:
    it is created. Other schemes are left to MLflow. Raises :class:`ConfigError` on ``tracking.uri``."""
    from orchestrator.redact import redact_url

    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        try:
            checked_store(uri)  # the connection probe the analysis commands use
        except StoreError as exc:
            cause = exc.__cause__
            reason = getattr(cause, "strerror", None) or str(cause or exc)
            raise ConfigError("tracking.uri", redact_url(uri), VALID_URIS,
                              why=f"cannot reach an MLflow server there: {reason}") from None
    elif uri.startswith("sqlite:///"):
        problem = _sqlite_unwritable(Path(uri.removeprefix("sqlite:///").split("?", 1)[0]))
        if problem:
            raise ConfigError("tracking.uri", redact_url(uri), VALID_URIS + " (a writable location)",
                              why=problem)


def _sqlite_unwritable(path: Path) -> str | None:
    """Why a sqlite store cannot be written at ``path``, or None. sqlite writes a journal next to the
    file, so its directory must be writable too; a missing directory is created if its nearest
    existing ancestor is a writable directory."""
    if path.is_dir():
        return f"{path} is a directory, not a sqlite file"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot create {path}: {folder} is a file, not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create {path}: {folder} is not writable"
    return None


def _client(uri: str):  # imported lazily: `import mlflow` costs ~1 s
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def ensure_experiment(uri: str, name: str) -> str:
    """The experiment's id, creating it with artifacts under runs/artifacts for a sqlite store
    (otherwise MLflow puts them in ./mlruns relative to whichever cwd created the experiment)."""
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        db = Path(uri.split("sqlite:///", 1)[1])
        db.parent.mkdir(parents=True, exist_ok=True)
        location = (db.parent / "artifacts").resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def config_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys -> string values, as MLflow params (``pp.async_depth`` -> ``"8"``)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(config_params(value, name + "."))
        else:
            text = json.dumps(value) if isinstance(value, list | dict) else str(value)
            out[name] = text[:MAX_PARAM_LEN]
    return out


class Tracker:
    """Opens and fills runs in one MLflow store."""

    def __init__(self, uri: str | None, experiment: str) -> None:
        self.uri = tracking_uri(uri)
        self.client = _client(self.uri)
        self.experiment_id = ensure_experiment(self.uri, experiment)

    def start_run(self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
        all_tags = {"mlflow.source.name": "run.py", "mlflow.user": _user(), **tags}
        if parent_run_id:
            all_tags[Tag.PARENT] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, run_id: str, metrics: Iterable[tuple[str, float, int]]) -> None:
        """(key, value, step) triples in one batch; MLflow chunks to its 1000-per-request limit."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v, step in metrics
                 if v is not None and not (isinstance(v, float) and math.isinf(v))]
        if batch:
            self.client.log_batch(run_id, metrics=batch)

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        if path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def log_dict(self, run_id: str, data: Any, artifact_file: str) -> None:
        self.client.log_dict(run_id, data, artifact_file)

    def finish(self, run_id: str, status: str) -> None:
        self.set_tags(run_id, {Tag.STATUS: status})
        self.client.set_terminated(run_id, _MLFLOW_STATUS[status])

    def children(self, parent_run_id: str) -> list[Any]:
        return self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=10000)


def ui_command(uri: str) -> str:
    from orchestrator.redact import redact_url

    if not uri.startswith("sqlite:"):  # a tracking server has its own UI
        return f"open {redact_url(uri)}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def runs_url(experiment_id: str, uri: str = "sqlite:") -> str:
    # the runs table (the experiment page itself opens on MLflow's GenAI overview)
    from orchestrator.redact import redact_url

    base = "http://127.0.0.1:5000" if uri.startswith("sqlite:") else redact_url(uri).rstrip("/")
    # workflowType: MLflow 3.17 otherwise opens its GenAI mode, which hides params and metrics
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


