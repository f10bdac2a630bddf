"""Where the shipped data lives: the Hydra config tree (``conf/``, with the hardware profiles), the
model directories (``models/<name>/config.json``) and the trace slices (``data/traces/``).

All three are installed as package data (``parasweep_conf``, ``parasweep_models`` and
``parasweep_traces``, mapped onto the checkout's ``conf/``, ``models/`` and ``data/traces/`` folders), so
they are found the same way from a source checkout, an editable install and a plain ``pip install .``.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"parasweep's data package {name} is not installed; run `pip install -e .`")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def conf_dir() -> Path:
    return _package_dir("parasweep_conf")


def hardware_dir() -> Path:
    return conf_dir() / "hardware"


@functools.cache
def models_dir() -> Path:
    return _package_dir("parasweep_models")


@functools.cache
def traces_dir() -> Path:
    """The trace slices parasweep ships (``data/traces/``)."""
    return _package_dir("parasweep_traces")


@functools.cache
def published_dir() -> Path:
    """The published measurements parasweep ships (``data/published/``)."""
    return _package_dir("parasweep_published")


def group_options(group: str) -> list[str]:
    """Names a config group offers (``conf/<group>/*.yaml``), for error messages."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def model_dir(path: str) -> Path:
    """A model's HF config directory. A relative ``models/<name>`` (how the shipped configs name them)
    is looked up among the shipped models; anything else is taken as given."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if p.parts[:1] == ("models",) and len(p.parts) == 2 and (models_dir() / p.parts[1]).is_dir():
        return models_dir() / p.parts[1]
    return p.resolve()
