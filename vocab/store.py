"""Where the MLflow store is when nobody says: one rule for the orchestrator, which writes there, and
for the ``analysis`` commands, which read it back."""

from __future__ import annotations

from pathlib import Path


def default_tracking_uri(cwd: Path | None = None) -> str:
    """``sqlite:///<absolute cwd>/runs/mlflow.db``. Four slashes, an absolute path: Ray workers with
    another working directory find the same file."""
    return f"sqlite:///{((cwd or Path.cwd()) / 'runs').resolve() / 'mlflow.db'}"
