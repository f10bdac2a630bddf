"""Where run output goes: ``runs/`` under the working directory (shipped data: vocab/assets.py). The
default MLflow store's rule lives in vocab/store.py, because the analysis commands that read the store
back may not import the orchestrator; it is re-exported here for the orchestrator's callers."""

from __future__ import annotations

from vocab.store import default_tracking_uri

__all__ = ["default_tracking_uri"]
