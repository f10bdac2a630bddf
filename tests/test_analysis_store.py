"""``analysis/store.py``: the one way the analysis commands find, check and open an MLflow store. Real
sqlite files made by MLflow itself, a real listening socket as a reachable server, a closed port as an
unreachable one."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from analysis.store import StoreError, checked_store, client, default_tracking_uri, masked
from tests.conftest import sqlite_store


def _mlflow_db(path: Path) -> Path:
    from mlflow.tracking import MlflowClient

    sqlite_store(path)
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # a real, readable store
    return path


def test_default_uri_is_the_one_the_orchestrator_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    from orchestrator.store.tracking import tracking_uri

    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri() == tracking_uri(None) == f"sqlite:///{tmp_path.resolve()}/runs/mlflow.db"
    assert default_tracking_uri(tmp_path / "x") == f"sqlite:///{(tmp_path / 'x').resolve()}/runs/mlflow.db"


def test_masked_hides_only_the_password() -> None:
    assert masked("https://alice:s3cr3t@mlflow.example:5000/x") == "https://alice:***@mlflow.example:5000/x"
    assert masked("http://alice@host:5000") == "http://alice@host:5000"
    assert masked("sqlite:////tmp/runs/mlflow.db") == "sqlite:////tmp/runs/mlflow.db"


def test_sqlite_and_plain_paths(tmp_path: Path) -> None:
    db = _mlflow_db(tmp_path / "runs" / "mlflow.db")
    expected = f"sqlite:///{db.resolve()}"
    assert checked_store(f"sqlite:///{db}") == expected
    assert checked_store(str(db)) == expected        # the .db file itself
    assert checked_store(str(tmp_path)) == expected  # a folder whose runs/ holds it
    missing = tmp_path / "other" / "mlflow.db"
    with pytest.raises(StoreError, match="no MLflow store at"):
        checked_store(f"sqlite:///{missing}")
    assert not missing.exists()  # never created by a check
    foreign = tmp_path / "notes.db"
    foreign.write_text("not a database\n" * 20)
    with pytest.raises(StoreError, match="is not an MLflow store"):
        checked_store(str(foreign))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreError, match="holds no MLflow store"):
        checked_store(str(empty))


def test_a_reachable_server_with_credentials_passes_and_an_unreachable_one_fails_fast() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        uri = f"http://alice:s3cr3t@127.0.0.1:{port}"
        assert checked_store(uri) == uri  # what the server says about the login is MLflow's to report
    with socket.socket() as closed:  # a port nobody listens on any more
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(StoreError, match="cannot reach the MLflow server") as err:
        checked_store(f"http://alice:s3cr3t@127.0.0.1:{port}")
    assert time.monotonic() - start < 5 and "s3cr3t" not in str(err.value) and "alice:***@" in str(err.value)


def test_client_needs_a_uri_and_keeps_the_users_http_settings(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="explicit tracking URI"):
        client("")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")
    uri = f"sqlite:///{_mlflow_db(tmp_path / 'mlflow.db')}"
    opened = client(uri)
    assert opened.tracking_uri == uri and opened.search_experiments()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"  # unset: no retries
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"  # set by the user: kept
