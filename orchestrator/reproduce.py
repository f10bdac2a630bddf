"""``python run.py reproduce=<RUN_ID | PATH> [overrides]``: run a past trial, or a whole sweep, again,
and say what differs.

A trial is re-composed from its recorded overrides (``config/overrides.yaml``) with today's code and
config tree, so it is measured anew; its resolved config is then compared with the one recorded (the
``parasweep.config_hash`` tag) and a difference is reported, not hidden. A sweep is re-run from its
recorded command with ``resume=false``. Further overrides on the command line are applied on top.

``PATH`` is a trial directory (it has ``config/overrides.yaml``) or a ``config/`` folder downloaded from
a run's artifacts (it has ``overrides.yaml``): the trial is re-composed from those overrides without
asking the tracking store about the original, so a copied trial directory is enough.

When the new trial ends, :func:`reproduction_report` puts the two side by side: the key metrics of
each load point (original, new, relative change) and the differences between the two environment
fingerprints (``env.json``, orchestrator/environment.py). A path keeps no metrics, so from a path only
the environments are compared.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

import yaml

from orchestrator.environment import ENV_FILE
from orchestrator.errors import UserError
from orchestrator.redact import MASK, redact_url
from orchestrator.store.tracking import Tracker, check_store, tracking_uri
from vocab.metric_keys import PointLabel, point_metrics
from vocab.status import RunKind, Tag
from vocab.telemetry import J_PER_TOKEN

OVERRIDES_FILE = "overrides.yaml"
# The metrics put side by side at each load point; J_PER_TOKEN only where both runs have it (GPU
# energy needs NVML or the simulated engine's model).
REPORT_METRICS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms")
WIDTH = 100  # the report's lines fit a terminal and a log viewer
# fingerprint keys that name a run's place, not its environment: every sweep starts a Ray node of its own
NOT_ENVIRONMENT = {"ray_node_id"}
# names in the one-line summary (the parasweep.reproduce_diff tag), so four metrics fit in one line
SHORT_NAMES = {"output_tok_s": "tok/s", "ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99",
               J_PER_TOKEN: "J/tok"}
# A value Hydra's override grammar takes unquoted; anything else is quoted.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_./:@+-]+")
VALID_TARGETS = ("a parasweep trial, prediction or sweep run id (see the MLflow UI or the end-of-sweep "
                 "table), a trial directory (with config/overrides.yaml) or a config/ artifact folder "
                 "(with overrides.yaml)")


def _arg_value(args: list[str], key: str) -> str | None:
    for arg in args:
        if arg.startswith(key + "="):
            return arg.split("=", 1)[1]
    return None


def expand_reproduce(args: list[str]) -> list[str]:
    """The command-line arguments that reproduce the run named by ``reproduce=<id or path>``
    (unchanged when there is none)."""
    target = _arg_value(args, "reproduce")
    if not target:
        return args
    extra = [a for a in args if not a.startswith("reproduce=") and a not in ("-m", "--multirun")]
    folder = original_folder(target)
    if folder is not None:
        recorded = _recorded_overrides(target, folder / OVERRIDES_FILE)
        # the absolute path, so the trial (maybe in a Ray worker elsewhere) finds the same folder
        return [*recorded, *extra, f"reproduce={_override_value(str(Path(target).expanduser().resolve()))}"]
    experiment = _arg_value(args, "tracking.experiment") or "parasweep"
    check_store(tracking_uri(_arg_value(args, "tracking.uri")))  # an unreachable server: one line, now
    tracker = Tracker(_arg_value(args, "tracking.uri"), experiment)
    run_id = target
    try:
        run = tracker.client.get_run(run_id)
    except Exception:
        raise UserError(f"reproduce={run_id}: no such run in {redact_url(tracker.uri)}; "
                        f"valid: {VALID_TARGETS}") from None
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
            recorded = _recorded_overrides(run_id, Path(path))
        return [*recorded, *extra, f"reproduce={run_id}"]
    raise UserError(f"reproduce={run_id}: run kind {kind!r}; valid: a parasweep trial, prediction or "
                    "sweep run")


def original_folder(target: str) -> Path | None:
    """The folder holding ``overrides.yaml`` when ``target`` names a trial directory or a config
    folder; None when it names no file at all and does not look like a path (a run id, then)."""
    path = Path(target).expanduser()
    if path.is_dir():
        for folder in (path / "config", path):
            if (folder / OVERRIDES_FILE).is_file():
                return folder
        raise UserError(f"reproduce={target}: the folder has neither config/{OVERRIDES_FILE} nor "
                        f"{OVERRIDES_FILE}; valid: {VALID_TARGETS}")
    if path.exists() or "/" in target or os.sep in target or target.startswith((".", "~")):
        raise UserError(f"reproduce={target}: no such folder; valid: {VALID_TARGETS}")
    return None


def _recorded_overrides(target: str, path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"reproduce={target}: cannot read {path.name} ({exc}); valid: the YAML list of "
                        "overrides a trial records") from None
    if data is not None and not isinstance(data, list):
        raise UserError(f"reproduce={target}: {path.name} holds a {type(data).__name__}; valid: the YAML "
                        "list of overrides a trial records")
    recorded = [str(o) for o in data or [] if not str(o).startswith(("reproduce=", "resume="))]
    _refuse_masked(target, recorded)
    return recorded


def _override_value(text: str) -> str:
    """``text`` as a Hydra override value: bare when the grammar takes it so, else single-quoted."""
    return text if _PLAIN_VALUE.fullmatch(text) else "'" + text.replace("'", "\\'") + "'"


def _is_path(original: str) -> bool:
    # expand_reproduce hands a path on as an absolute one; a run id never starts with "/"
    return os.path.isabs(original)


def _refuse_masked(target: str, recorded: list[str]) -> None:
    masked = [a.split("=", 1)[0] for a in recorded if a.endswith("=" + MASK)]
    if masked:
        raise UserError(f"reproduce={target}: {', '.join(masked)} were recorded redacted; valid: pass them "
                        "again on the command line after reproduce=...")


def compare_with_original(tracker: Tracker, original_run_id: str, new_hash: str) -> str | None:
    """A one-line warning when a reproduced trial's config differs from the original's."""
    if _is_path(original_run_id):  # a path records no config hash (reproduction_report still compares)
        return None
    try:
        original = tracker.client.get_run(original_run_id)
    except Exception:
        return None
    old_hash = original.data.tags.get(Tag.CONFIG_HASH)
    if original.data.tags.get(Tag.KIND) == "sweep" or old_hash in (None, new_hash):
        return None
    return (f"reproduce={original_run_id}: the resolved config (or engine version) differs from the "
            f"original's (config hash {new_hash} vs {old_hash}): compare config/resolved.yaml of both runs")


# -- the side-by-side when the new trial ends ---------------------------------------------------------

def reproduction_report(tracker: Tracker, original_run_id_or_path: str, new_run_id: str) -> list[str]:
    """Original vs new, in lines of at most WIDTH columns: a one-line summary first (the
    ``parasweep.reproduce_diff`` tag), then the key metrics of each load point with the relative
    change, then the environment differences (key: original -> new)."""
    new = tracker.client.get_run(new_run_id)
    new_env = _run_env(tracker, new_run_id)
    original = original_run_id_or_path
    if _is_path(original):
        # a long path keeps its end: the trial's own folder names it
        source = "original: " + (original if len(original) <= WIDTH - 10 else "…" + original[11 - WIDTH:])
        old_metrics: dict[PointLabel, dict[str, float]] | None = None
        metrics_note = "original's metrics are not available (a path keeps none; a run id has them)"
        old_env = _path_env(Path(original))
    else:
        old_run, why = _original_run(tracker, original, new.data.tags.get(Tag.OVERRIDES))
        if old_run is None:
            source, old_metrics, metrics_note, old_env = f"original: run {original}", None, why, None
        else:
            source = f"original: run {old_run.info.run_id} {old_run.info.run_name}"
            old_metrics = point_metrics(old_run.data.metrics)
            metrics_note = "" if old_metrics else "original's metrics are not available (it logged none)"
            old_env = _run_env(tracker, old_run.info.run_id)
    rows = _metric_rows(old_metrics, point_metrics(new.data.metrics)) if old_metrics else []
    env_lines, env_summary = _env_lines(old_env, new_env)
    lines = [_summary(rows, env_summary, metrics_note), _clip(source),
             _clip(f"new:      run {new_run_id} {new.info.run_name}")]
    if rows:
        lines.append(f"  {'point':<7}{'metric':<22}{'original':>14}{'new':>14}{'change':>10}")
        lines += [f"  {p:<7}{m:<22}{_num(a):>14}{_num(b):>14}{_change(a, b):>10}" for p, m, a, b in rows]
    elif metrics_note:
        lines.append(_clip("  " + metrics_note))
    return lines + env_lines


def _original_run(tracker: Tracker, run_id: str, label: str | None) -> tuple[Any, str]:
    """The original trial (for a sweep: its trial with the new trial's label), or None and why not."""
    try:
        run = tracker.client.get_run(run_id)
    except Exception:
        return None, f"original run {run_id} is not in {redact_url(tracker.uri)}"
    if run.data.tags.get(Tag.KIND) != RunKind.SWEEP:
        return run, ""
    same = [r for r in tracker.children(run_id) if r.data.tags.get(Tag.OVERRIDES) == label]
    if not same:
        return None, f"the original sweep has no trial labelled {label!r}"
    # the one that ran to the end, if several did (a resumed sweep)
    return max(same, key=lambda r: (r.data.tags.get(Tag.STATUS) == "ok", r.info.start_time or 0)), ""


def _run_env(tracker: Tracker, run_id: str) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return json.loads(Path(tracker.client.download_artifacts(run_id, ENV_FILE, tmp)).read_text())
        except Exception:  # no such artifact: a run from before fingerprints, or one that failed early
            return None


def _path_env(path: Path) -> dict[str, Any] | None:
    # a trial directory has env.json beside config/; a config/ folder may sit in one
    for candidate in (path / ENV_FILE, path.parent / ENV_FILE if path.name == "config" else None):
        if candidate is not None and candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError):
                return None
    return None


def _metric_rows(old: dict[PointLabel, dict[str, float]], new: dict[PointLabel, dict[str, float]]
                 ) -> list[tuple[str, str, float | None, float | None]]:
    rows = []
    for point in sorted(set(old) | set(new)):
        a, b = old.get(point, {}), new.get(point, {})
        for metric in REPORT_METRICS:
            if metric in a or metric in b:
                rows.append((str(point), metric, a.get(metric), b.get(metric)))
        if J_PER_TOKEN in a and J_PER_TOKEN in b:
            rows.append((str(point), J_PER_TOKEN, a[J_PER_TOKEN], b[J_PER_TOKEN]))
    return rows


def _relative(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return None
    if a == 0:
        return 0.0 if b == 0 else None
    rel = (b - a) / abs(a)
    return 0.0 if abs(rel) < 5e-4 else rel  # what rounds to 0.0% is shown as +0.0%, not -0.0%


def _change(a: float | None, b: float | None) -> str:
    rel = _relative(a, b)
    return "n/a" if rel is None else f"{rel * 100:+.1f}%"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _flat(env: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return out


def _env_lines(old: dict[str, Any] | None, new: dict[str, Any] | None) -> tuple[list[str], str]:
    """The environment part of the report, and its few words for the summary."""
    if old is None:
        return ["  environment: original has no environment fingerprint"], "original has no env.json"
    if new is None:
        return ["  environment: this run has no environment fingerprint"], "this run has no env.json"
    a, b = _flat(old), _flat(new)
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and k not in NOT_ENVIRONMENT]
    if not keys:
        return ["  environment: no differences"], "env: no differences"
    lines = [f"  environment: {len(keys)} difference(s) (key: original -> new)"]
    for key in keys:
        room = max(8, (WIDTH - len(key) - 10) // 2)
        lines.append(_clip(f"    {key}: {_cut(a.get(key, '(absent)'), room)} -> "
                           f"{_cut(b.get(key, '(absent)'), room)}"))
    return lines, f"env: {len(keys)} difference(s)"


def _summary(rows: list[tuple[str, str, float | None, float | None]], env_summary: str,
             metrics_note: str) -> str:
    """One line: each metric's largest relative change over the load points, and the environment."""
    largest: dict[str, float] = {}
    for _point, metric, a, b in rows:
        rel = _relative(a, b)
        if rel is not None and abs(rel) >= abs(largest.get(metric, 0.0)):
            largest[metric] = rel
    if largest:
        metrics = ", ".join(f"{SHORT_NAMES.get(m, m)} {_pct(v)}" for m, v in largest.items())
    else:
        metrics = "original's metrics not available" if metrics_note else "no metrics to compare"
    return _clip(f"reproduction: {metrics}; {env_summary}")


def _pct(rel: float) -> str:
    return f"{rel * 100:+.1f}%" if abs(rel) < 0.1 else f"{rel * 100:+.0f}%"


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[:room - 1] + "…"


def _clip(line: str) -> str:
    return _cut(line, WIDTH)
