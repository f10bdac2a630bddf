"""Where run output goes: ``runs/`` under the working directory (shipped data: vocab/assets.py)."""

from __future__ import annotations

from pathlib import Path


def runs_dir(cwd: Path | None = None) -> Path:
    """Default output folder (MLflow store, Hydra job dirs): ``runs/`` under the working directory."""
    return ((cwd or Path.cwd()) / "runs").resolve()


def default_tracking_uri(cwd: Path | None = None) -> str:
    # four slashes: an absolute sqlite path, so Ray workers with another cwd find the same file
    return f"sqlite:///{runs_dir(cwd) / 'mlflow.db'}"

