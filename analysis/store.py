"""The MLflow store as the ``analysis`` commands open it: the default URI (the one parasweep writes,
vocab/store.py), checks that fail in one line instead of MLflow creating an empty store at a mistyped
path or retrying an unreachable server for minutes, the URI with its password masked for anything a
person sees, and a client that gives up on a dead server in seconds."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vocab.store import default_tracking_uri

__all__ = ["PROBE_TIMEOUT_S", "StoreError", "checked_store", "client", "default_tracking_uri", "masked"]

PROBE_TIMEOUT_S = 3.0  # an HTTP store that does not accept a connection in this time is unreachable
HTTP_TIMEOUT_S = "15"  # one MLflow request to a server that answered the probe


class StoreError(Exception):
    """Not a store, or not reachable: the message is one line for a user, naming --tracking-uri."""


def masked(uri: str) -> str:
    """The URI with the password of ``scheme://user:pass@host`` masked: messages and reports are read
    and shared by people who should not see it."""
    return re.sub(r"(://[^/:@]+):[^/@]*@", r"\1:***@", uri)


def _sqlite_checked(path: Path, uri: str) -> str:
    """``sqlite:///path`` when ``path`` is an MLflow sqlite store. Checked read-only first, because
    MLflow would otherwise create an empty store at a mistyped path and find nothing there."""
    if not path.exists():
        raise StoreError(f"--tracking-uri {masked(uri)}: no MLflow store at {path} (without the flag it is "
                         "runs/mlflow.db under the current directory, where run.py writes it)")
    if not path.is_file():
        raise StoreError(f"--tracking-uri {masked(uri)}: {path} is a directory, not an MLflow sqlite file")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"--tracking-uri {masked(uri)}: {path} is not an MLflow store ({exc})") from exc
    if not {"runs", "experiments"} <= tables:
        raise StoreError(f"--tracking-uri {masked(uri)}: {path} is a sqlite file but not an MLflow store "
                         "(no runs/experiments tables)")
    return f"sqlite:///{path.resolve()}"


def checked_store(uri: str) -> str:
    """The tracking URI to open, after the checks: a sqlite file must exist and hold MLflow's tables;
    an http(s) server must accept a connection within :data:`PROBE_TIMEOUT_S` (whatever it then says
    about credentials is for MLflow's client to report); a plain path may name the ``.db`` file or a
    folder holding ``mlflow.db``, ``runs/mlflow.db`` or an MLflow file store. Any other scheme
    (postgresql://, databricks) is left to MLflow. Raises :class:`StoreError`."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        rest = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not rest or rest.startswith(":memory:"):
            raise StoreError(f"--tracking-uri {masked(uri)}: not a sqlite file path (expected "
                             "sqlite:///<path>)")
        return _sqlite_checked(Path(rest.split("?", 1)[0]), uri)
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname or "localhost", port), timeout=PROBE_TIMEOUT_S):
                pass
        except OSError as exc:
            raise StoreError(f"--tracking-uri {masked(uri)}: cannot reach the MLflow server "
                             f"({exc.strerror or exc})") from exc
        return uri
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # a plain path (or a drive letter)
        path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser()
        if path.is_dir():
            for candidate in (path / "mlflow.db", path / "runs" / "mlflow.db"):
                if candidate.is_file():
                    return _sqlite_checked(candidate, uri)
            if any(path.glob("*/meta.yaml")):  # MLflow's own file store
                return path.resolve().as_uri()
            raise StoreError(f"--tracking-uri {masked(uri)}: {path} holds no MLflow store (looked for "
                             "mlflow.db, runs/mlflow.db and an MLflow file store)")
        return _sqlite_checked(path, uri)
    return uri


def client(uri: str) -> Any:
    """An MlflowClient of exactly ``uri`` (never MLflow's own default, which would create ./mlruns).
    MLflow's HTTP client retries for minutes by default; a reading command should fail in seconds, so
    no retries and a short timeout, unless the user set them."""
    if not uri:
        raise ValueError("client() needs an explicit tracking URI")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_TIMEOUT_S)
    # with tqdm installed (Optuna brings it) MLflow draws a progress bar for every artifact it reads
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)
