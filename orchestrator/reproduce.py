"""``python run.py reproduce=<RUN_ID> [overrides]``: run a past trial, or a whole sweep, again.

A trial is re-composed from its recorded overrides (``config/overrides.yaml``) with today's code and
config tree, so it is measured anew; its resolved config is then compared with the one recorded (the
``parasweep.config_hash`` tag) and a difference is reported, not hidden. A sweep is re-run from its
recorded command with ``resume=false``. Further overrides on the command line are applied on top.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import yaml

from orchestrator.errors import UserError
from orchestrator.redact import MASK
from orchestrator.tracking import Tracker
from vocab.status import Tag


def _arg_value(args: list[str], key: str) -> str | None:
    for arg in args:
        if arg.startswith(key + "="):
            return arg.split("=", 1)[1]
    return None


def expand_reproduce(args: list[str]) -> list[str]:
    """The command-line arguments that reproduce the run named by ``reproduce=<id>`` (unchanged
    when there is none)."""
    run_id = _arg_value(args, "reproduce")
    if not run_id:
        return args
    extra = [a for a in args if not a.startswith("reproduce=") and a not in ("-m", "--multirun")]
    experiment = _arg_value(args, "tracking.experiment") or "parasweep"
    tracker = Tracker(_arg_value(args, "tracking.uri"), experiment)
    try:
        run = tracker.client.get_run(run_id)
    except Exception:
        raise UserError(f"reproduce={run_id}: no such run in {tracker.uri}; valid: a parasweep trial or "
                        "sweep run id (see the MLflow UI or the end-of-sweep table)") from None
    kind = run.data.tags.get(Tag.KIND)
    if kind == "sweep":
        command = run.data.tags.get(Tag.COMMAND, "")
        recorded = [a for a in shlex.split(command)[2:] if not a.startswith(("resume=", "reproduce="))]
        _refuse_masked(run_id, recorded)
        multirun = ["-m"] if "-m" in recorded or "--multirun" in recorded else []
        recorded = [a for a in recorded if a not in ("-m", "--multirun")]
        return [*multirun, *recorded, *extra, "resume=false", f"reproduce={run_id}"]
    if kind in ("trial", "prediction"):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = tracker.client.download_artifacts(run_id, "config/overrides.yaml", tmp)
            except Exception:
                raise UserError(f"reproduce={run_id}: the run has no config/overrides.yaml artifact to "
                                "re-compose it from") from None
            recorded = [str(o) for o in (yaml.safe_load(Path(path).read_text()) or [])]
        recorded = [a for a in recorded if not a.startswith(("reproduce=", "resume="))]
        _refuse_masked(run_id, recorded)
        return [*recorded, *extra, f"reproduce={run_id}"]
    raise UserError(f"reproduce={run_id}: run kind {kind!r}; valid: a parasweep trial, prediction or "
                    "sweep run")


def _refuse_masked(run_id: str, recorded: list[str]) -> None:
    masked = [a.split("=", 1)[0] for a in recorded if a.endswith("=" + MASK)]
    if masked:
        raise UserError(f"reproduce={run_id}: {', '.join(masked)} were recorded redacted; valid: pass them "
                        "again on the command line after reproduce=...")


def compare_with_original(tracker: Tracker, original_run_id: str, new_hash: str) -> str | None:
    """A one-line warning when a reproduced trial's config differs from the original's."""
    try:
        original = tracker.client.get_run(original_run_id)
    except Exception:
        return None
    old_hash = original.data.tags.get(Tag.CONFIG_HASH)
    if original.data.tags.get(Tag.KIND) == "sweep" or old_hash in (None, new_hash):
        return None
    return (f"reproduce={original_run_id}: the resolved config (or engine version) differs from the "
            f"original's (config hash {new_hash} vs {old_hash}): compare config/resolved.yaml of both runs")
