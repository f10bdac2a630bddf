"""Resume: a trial whose resolved config hash already succeeded in this experiment is not run again.
Its new child run is marked ``skipped`` and carries the earlier run's params and metrics, with a tag
naming that run, so the sweep's table and the UI stay complete."""

from __future__ import annotations

from typing import Any

from orchestrator.store.tracking import Tracker
from vocab.metric_keys import MetricKey
from vocab.status import PLACEMENT_TAGS, Tag


def previous_successes(tracker: Tracker, hashes: set[str]) -> dict[str, Any]:
    """config hash -> the most recent successful (measured, not reused) trial run with that hash."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string="tags.`parasweep.kind` = 'trial' and tags.`parasweep.status` = 'ok'",
        order_by=["attributes.start_time DESC"], max_results=50000)
    found: dict[str, Any] = {}
    for run in runs:
        h = run.data.tags.get(Tag.CONFIG_HASH)
        if h in hashes and h not in found:
            found[h] = run
    return found


def record_reuse(tracker: Tracker, parent_run_id: str | None, num: int, label: str, previous: Any) -> str:
    tags = {k: v for k, v in previous.data.tags.items() if k.startswith("parasweep.")}
    tags.update({Tag.KIND: "trial", Tag.STATUS: "skipped", Tag.TRIAL_NUM: str(num),
                 Tag.OVERRIDES: label, Tag.REUSED_RUN_ID: previous.info.run_id})
    for stale in (Tag.TRIAL_DIR, Tag.ERROR, Tag.CUDA_VISIBLE_DEVICES, *PLACEMENT_TAGS.values()):
        tags.pop(stale, None)  # they describe the earlier run's execution, not this reuse
    run_id = tracker.start_run(f"#{num} {label} (reused)", tags=tags, parent_run_id=parent_run_id)
    tracker.log_params(run_id, previous.data.params)
    # every per-point value (measured and predicted), and the step series rebuilt from the measured ones
    points, series = [], []
    for key, value in previous.data.metrics.items():
        parsed = MetricKey.parse(key)
        if parsed is None or parsed.point is None:
            continue
        points.append((key, value, 0))
        if not parsed.prefix:
            series_key, step = MetricKey.series(parsed.point, parsed.metric)
            series.append((str(series_key), value, step))
    tracker.log_metrics(run_id, points + series)
    tracker.finish(run_id, "skipped")
    return run_id
