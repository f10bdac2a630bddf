"""Where things live: the project root (shipped models and configs) and the run output folder."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = PROJECT_ROOT / "conf"


def model_dir(path: str) -> Path:
    """A model's HF config directory; relative paths are relative to the project root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def runs_dir(cwd: Path | None = None) -> Path:
    """Default output folder (MLflow store, Hydra job dirs): ``runs/`` under the working directory."""
    return ((cwd or Path.cwd()) / "runs").resolve()


def default_tracking_uri(cwd: Path | None = None) -> str:
    # four slashes: an absolute sqlite path, so Ray workers with another cwd find the same file
    return f"sqlite:///{runs_dir(cwd) / 'mlflow.db'}"


def group_options(group: str) -> list[str]:
    """Names a config group offers (``conf/<group>/*.yaml``), for error messages."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
