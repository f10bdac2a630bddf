"""The MLflow store (layout: docs/mlflow-layout.md): a parent run per sweep, a child run per trial.

Everything goes through ``MlflowClient`` with explicit run ids (no fluent global state), because
trials run in Ray worker processes, several at a time, against the same store.

A tracking server that stops answering does not cost results: a write that cannot reach it goes to
this process's spool file (``orchestrator/store/spool.py``), and so does every later write of the same
run; ``python -m orchestrator sync`` replays the spool once the server is back (docs/mlflow-layout.md,
"When the tracking server goes away").
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from analysis.store import StoreError, checked_store
from orchestrator.errors import ConfigError
from orchestrator.paths import default_tracking_uri
from orchestrator.redact import MASK, redact_url
from orchestrator.store.spool import SpoolWriter, is_placeholder, new_placeholder, spool_root
from vocab.status import EXPERIMENT_KIND, Tag, TrialStatus

log = logging.getLogger("parasweep")
T = TypeVar("T")

MLFLOW_STATUS = {"ok": "FINISHED", "skipped": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
MAX_PARAM_LEN = 6000  # longer values are truncated by MLflow; keep big blobs as artifacts


def tracking_uri(uri: str | None) -> str:
    return uri or default_tracking_uri()


VALID_URIS = "a reachable MLflow tracking server URL, or null for runs/mlflow.db"


def check_store(uri: str) -> None:
    """Refuse, in one line, a store the sweep could not write, before anything launches: an http(s)
    server that does not accept a connection (MLflow's client would retry it for minutes, silently),
    or a sqlite file that cannot be created or written. A sqlite file that does not exist yet is fine:
    it is created. Other schemes are left to MLflow. Raises :class:`ConfigError` on ``tracking.uri``."""
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


# MLflow's HTTP client retries a failed request 7 times with a doubling backoff (minutes) and waits
# 120 s for an answer. A trial must not stall that long on a server that went away: its writes are
# spooled instead. 2 retries 1 s and 2 s apart ride out a blip; a user's own settings win. MLflow
# also prints a "View run" URL to stdout whenever a run ends; the end of a sweep prints where to look.
HTTP_CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
REPROBE_S = 30.0  # a process that is spooling asks the server again at most this often
PROBE_TIMEOUT_S = 3.0
# answers that mean "the server, or the proxy in front of it, is not there now"; any other 4xx/5xx
# is an answer about the request itself, and spooling it would only fail again at the sync
TRANSIENT_STATUS = frozenset({429, 502, 503, 504})


def is_http(uri: str) -> bool:
    return uri.split(":", 1)[0].lower() in ("http", "https")


def is_local_store(uri: str) -> bool:
    """A store that is a file on this machine (sqlite, a file store, a plain path), which processes on
    other machines cannot write; not a server, a remote database or ``databricks``."""
    return uri.split(":", 1)[0].lower() in ("sqlite", "file") or ":" not in uri


class _QuietRetries(logging.Filter):
    """Drops urllib3's "Retrying ..." warning for MLflow's own requests: while the server is away,
    each retry would print one, and the spool's single warning says what happens instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        ours = "/api/2.0/mlflow" in message or "mlflow-artifacts" in message
        return not (message.startswith("Retrying") and ours)


_QUIET_RETRIES = _QuietRetries()


def mlflow_client(uri: str) -> Any:  # imported lazily: `import mlflow` costs ~1 s
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    # with tqdm installed (Optuna brings it) MLflow draws a progress bar for every artifact it reads
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if is_http(uri):
        for name, value in HTTP_CLIENT_ENV.items():
            os.environ.setdefault(name, value)
        # added once however often this runs: a logger keeps each filter object once
        logging.getLogger("urllib3.connectionpool").addFilter(_QUIET_RETRIES)
    from mlflow.tracking import MlflowClient

    # MLflow announces a new sqlite store's schema set-up ("Creating initial MLflow database tables...",
    # "Updating database tables") at INFO on the user's terminal: routine, not the user's concern
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def unreachable(exc: BaseException) -> str:
    """Why a failed MLflow call means the server could not be reached (refused, reset, timed out, or
    429/502/503/504 after the client's retries), in a few words; "" when the failure is an answer
    about the request (a 4xx, a bad value). MLflow wraps the transport error without ``from``, so
    the chain is followed through ``__context__`` as well."""
    import requests

    chain: list[BaseException] = []
    err: BaseException | None = exc
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    for err in chain:
        if isinstance(err, requests.exceptions.SSLError):  # a certificate problem: no wait will fix it
            return ""
        if isinstance(err, requests.exceptions.HTTPError) and err.response is not None:
            code = err.response.status_code
            return f"HTTP {code}" if code in TRANSIENT_STATUS else ""
        if isinstance(err, requests.exceptions.RetryError):  # "too many 503 error responses"
            codes = [int(c) for c in re.findall(r"\b(\d{3}) error", str(err))]
            return f"HTTP {codes[0]}" if codes and codes[0] in TRANSIENT_STATUS else ""
        match = re.search(r"error code (\d{3}) != 200", str(err))  # MLflow's words for a bare status
        if match:
            return f"HTTP {match.group(1)}" if int(match.group(1)) in TRANSIENT_STATUS else ""
    for err in reversed(chain):  # the innermost transport error says it best: "Connection refused"
        if isinstance(err, requests.exceptions.Timeout | TimeoutError):
            return "timed out"
        if isinstance(err, requests.exceptions.ConnectionError | ConnectionError):
            return (err.strerror if isinstance(err, OSError) and err.strerror else "") or type(err).__name__
    return ""


def server_answers(uri: str) -> bool:
    """One short request to the server (its ``/health``, without credentials): True when anything
    answers below 500. Cheaper than an MLflow call, which would retry."""
    import urllib.error
    import urllib.request

    parts = urlsplit(uri)
    url = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/health"  # host[:port], no user:password
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:
            return int(resp.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def scrubbed(text: str, uri: str) -> str:
    """``text`` (an error message, which may quote the URL) without the URI's password."""
    password = urlsplit(uri).password
    return text.replace(password, MASK) if password else text


class _Outage:
    """This process's view of one server and experiment: whether it answers, the runs with writes in
    the spool (every later write of such a run goes there too, so the sync applies a run's writes in
    the order they were made), and the spool file. Shared by every Tracker of the process."""

    def __init__(self, uri: str, experiment: str) -> None:
        self.uri, self.experiment = uri, experiment
        self.down = False
        self.last_try = 0.0
        self.spooled: set[str] = set()
        self.writer: SpoolWriter | None = None
        self.lock = threading.RLock()
        self.files: list[Path] = []  # every spool file this process wrote

    def went_down(self, exc: BaseException) -> None:
        with self.lock:
            if not self.down:
                log.warning("tracking server %s unreachable (%s): writes go to %s until it is back; "
                            "`python -m orchestrator sync` replays them", redact_url(self.uri),
                            unreachable(exc), spool_root())
            self.down, self.last_try = True, time.monotonic()

    def answers_now(self) -> bool:
        """Ask the server that was down now (one short request)."""
        with self.lock:
            self.last_try = time.monotonic()
            if server_answers(self.uri):
                self.down = False
                log.warning("tracking server answers again: new runs are written to it directly")
            return not self.down

    def believed_down(self) -> bool:
        """Down, and asked less than :data:`REPROBE_S` ago (or asked again now and still down)."""
        with self.lock:
            if not self.down:
                return False
            return time.monotonic() - self.last_try < REPROBE_S or not self.answers_now()

    def must_spool(self, run_id: str | None) -> bool:
        """A write about ``run_id`` goes to the spool: the run is only in the spool (a placeholder id),
        or has earlier writes there, or the server is down. A run with nothing spooled is a safe
        point to write directly again once the server answers."""
        with self.lock:
            if run_id and (is_placeholder(run_id) or run_id in self.spooled):
                return True
            return self.believed_down()

    def spool(self, op: dict[str, Any]) -> None:
        with self.lock:
            if self.writer is None or self.writer.closed:
                self.writer = SpoolWriter(spool_root(), self.uri, redact_url(self.uri), self.experiment)
                self.files.append(self.writer.path)
            self.writer.append(op)
            run_id = op["run"]
            self.spooled.add(run_id)
            if op["op"] == "finish":
                self.writer.open_runs.discard(run_id)
                if not self.writer.open_runs:
                    # every run this file wrote is closed: finish the file, so a sync can take it
                    # even while this process lives on (a long-lived Ray worker)
                    self.writer.close()
            else:
                self.writer.open_runs.add(run_id)

    def close(self) -> None:
        with self.lock:
            if self.writer is not None:
                self.writer.close()
            # what was spooled is about to be synced; later writes of those runs may go directly
            self.spooled.clear()


_OUTAGES: dict[tuple[int, str, str], _Outage] = {}
_OUTAGES_LOCK = threading.Lock()


def _outage(uri: str, experiment: str) -> _Outage:
    key = (os.getpid(), uri, experiment)  # a forked child must not share its parent's open file
    with _OUTAGES_LOCK:
        if key not in _OUTAGES:
            _OUTAGES[key] = _Outage(uri, experiment)
        return _OUTAGES[key]


def close_spools() -> list[Path]:
    """Finish this process's spool files (so a sync can take them now); the files it wrote."""
    with _OUTAGES_LOCK:
        outages = [o for (pid, _, _), o in _OUTAGES.items() if pid == os.getpid()]
    files: list[Path] = []
    for outage in outages:
        outage.close()
        files += outage.files
    return files


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def ensure_experiment(uri: str, name: str) -> str:
    """The experiment's id, creating it with artifacts under runs/artifacts for a sqlite store
    (otherwise MLflow puts them in ./mlruns relative to whichever cwd created the experiment)."""
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(Tag.EXPERIMENT_KIND) != EXPERIMENT_KIND:  # made by an older parasweep, or by hand
            client.set_experiment_tag(exp.experiment_id, Tag.EXPERIMENT_KIND, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:"):
        db = Path(uri.split("sqlite:///", 1)[1])
        db.parent.mkdir(parents=True, exist_ok=True)
        location = (db.parent / "artifacts").resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location,
                                        tags={Tag.EXPERIMENT_KIND: EXPERIMENT_KIND})
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
    """Opens and fills runs in one MLflow store. With an http(s) server, a write that cannot reach it
    is spooled (see the module's docstring) and never raises; reads (:meth:`children`) do raise."""

    def __init__(self, uri: str | None, experiment: str) -> None:
        self.uri = tracking_uri(uri)
        self.experiment = experiment
        self.client = mlflow_client(self.uri)
        self._outage = _outage(self.uri, experiment) if is_http(self.uri) else None
        self.experiment_id: str | None = None
        if self._outage is not None and self._outage.believed_down():
            return  # known to be down: the first write spools, and the id is looked up when it is back
        try:
            self.experiment_id = ensure_experiment(self.uri, experiment)
        except Exception as exc:
            if self._outage is None or not unreachable(exc):
                raise
            self._outage.went_down(exc)

    @property
    def spooling(self) -> bool:
        """Whether this process has spooled writes for this server."""
        return self._outage is not None and bool(self._outage.files)

    def _experiment(self) -> str:
        if self.experiment_id is None:
            self.experiment_id = ensure_experiment(self.uri, self.experiment)
        return self.experiment_id

    def _write(self, op: dict[str, Any], about: str | None, direct: Callable[[], T]) -> T | None:
        """``direct()``, or ``op`` appended to the spool when the server cannot take it (``about``: the
        run whose earlier writes decide, the parent for a new run)."""
        outage = self._outage
        if outage is None:
            return direct()
        if not outage.must_spool(about):
            try:
                return direct()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                outage.went_down(exc)
        outage.spool(op)
        return None

    def start_run(self, name: str, tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
        """The new run's id: the server's, or a placeholder (``spool-<hex>``) when spooled, which the
        other methods accept like any id."""
        spool_id = new_placeholder()
        all_tags = {"mlflow.source.name": "run.py", "mlflow.user": _user(), **tags, Tag.SPOOL_ID: spool_id}
        if parent_run_id:
            all_tags[Tag.PARENT] = parent_run_id
        started = _now_ms()

        def direct() -> str:
            run = self.client.create_run(self._experiment(), start_time=started, run_name=name, tags=all_tags)
            return run.info.run_id

        op = {"op": "start_run", "run": spool_id, "name": name, "tags": all_tags, "time": started}
        return self._write(op, parent_run_id, direct) or spool_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        values = {k: str(v) for k, v in params.items()}
        self._write({"op": "log_params", "run": run_id, "params": values}, run_id,
                    lambda: self.client.log_batch(run_id, params=[Param(k, v) for k, v in values.items()]))

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        values = {k: str(v) for k, v in tags.items()}
        self._write({"op": "set_tags", "run": run_id, "tags": values}, run_id,
                    lambda: self._log_tags(run_id, values))

    def _log_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_metrics(self, run_id: str, metrics: Iterable[tuple[str, float, int]]) -> None:
        """(key, value, step) triples in one batch; MLflow chunks to its 1000-per-request limit. Each
        value keeps the time it was logged, also through the spool, so a value sent twice (a sync
        repeated after a crash) is one row in MLflow's SQL store, not two."""
        from mlflow.entities import Metric

        now = _now_ms()
        batch = [(k, float(v), now, int(step)) for k, v, step in metrics
                 if v is not None and not (isinstance(v, float) and math.isinf(v))]
        if batch:
            self._write({"op": "log_metrics", "run": run_id, "metrics": batch}, run_id,
                        lambda: self.client.log_batch(run_id, metrics=[Metric(*m) for m in batch]))

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None, *,
                     scratch: bool = False) -> None:
        """``scratch``: the file will be gone soon (a temporary directory); spooled, it is copied into
        the spool. Any other file is uploaded from where it is when the spool is synced."""
        if path.exists():
            op = {"op": "log_artifact", "run": run_id, "path": str(path.resolve()),
                  "artifact_path": artifact_path, "copy": scratch}
            self._write(op, run_id, lambda: self.client.log_artifact(run_id, str(path), artifact_path))

    def log_dict(self, run_id: str, data: Any, artifact_file: str) -> None:
        self._write({"op": "log_dict", "run": run_id, "data": data, "artifact_file": artifact_file}, run_id,
                    lambda: self.client.log_dict(run_id, data, artifact_file))

    def finish(self, run_id: str, status: str) -> None:
        ended = _now_ms()

        def direct() -> None:
            self._log_tags(run_id, {Tag.STATUS: status})
            self.client.set_terminated(run_id, MLFLOW_STATUS[status], end_time=ended)

        self._write({"op": "finish", "run": run_id, "status": status, "time": ended}, run_id, direct)

    def close_sweep_later(self, sweep_run_id: str, code: int) -> None:
        """The sweep's end, when its trials cannot be read: spooled, and done by the sync once every
        trial's writes are in the store (trials left running closed, the sweep's status decided by
        :func:`sweep_status` from the trials and ``code``, the driver's exit code)."""
        if self._outage is None:
            raise RuntimeError("only an http(s) tracking server has a spool")
        self._outage.spool({"op": "close_sweep", "run": sweep_run_id, "code": code, "time": _now_ms()})

    def children(self, parent_run_id: str) -> list[Any]:
        # a server known to have been down is asked in one short request, not another round of retries
        if self._outage is not None and self._outage.down and not self._outage.answers_now():
            raise ConnectionError(f"tracking server {redact_url(self.uri)} is not answering")
        return self.client.search_runs(
            [self._experiment()], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
            max_results=10000)


def _now_ms() -> int:
    return int(time.time() * 1000)


def interrupted_status(code: int) -> TrialStatus:
    """What a trial still ``running`` when its sweep ended is closed as: killed after Ctrl-C (exit
    130), failed otherwise (its worker died)."""
    return TrialStatus.KILLED if code == 130 else TrialStatus.FAILED


def trial_status(value: str | None) -> TrialStatus:
    """A trial's status tag; a missing or unknown value (a run written by another version, or edited
    by hand) counts as failed: only a status known to be a success may make the sweep ok."""
    try:
        return TrialStatus(value)
    except ValueError:
        return TrialStatus.FAILED


def sweep_status(code: int, trial_statuses: Iterable[str | None], none_ok: bool = False) -> str:
    """The sweep's status from its trials' status tags and the driver's exit code: killed after
    Ctrl-C or when a trial was killed; failed on a non-zero exit, a trial that neither succeeded nor
    was skipped, or no trials at all (unless ``none_ok``); ok otherwise."""
    statuses = [trial_status(s) for s in trial_statuses]
    if code == 130 or TrialStatus.KILLED in statuses:
        return "killed"
    if code != 0 or (not statuses and not none_ok) or not all(s.succeeded for s in statuses):
        return "failed"
    return "ok"


def ui_command(uri: str) -> str:
    if not uri.startswith("sqlite:"):  # a tracking server has its own UI
        return f"open {redact_url(uri)}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def runs_url(experiment_id: str, uri: str = "sqlite:") -> str:
    # the runs table (the experiment page itself opens on MLflow's GenAI overview)
    base = "http://127.0.0.1:5000" if uri.startswith("sqlite:") else redact_url(uri).rstrip("/")
    # workflowType: MLflow 3.17 otherwise opens its GenAI mode, which hides params and metrics
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


