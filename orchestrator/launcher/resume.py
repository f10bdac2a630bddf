"""Resume: a trial whose resolved config hash already succeeded in this experiment is not run again.
Its new child run is marked ``skipped`` and carries the earlier run's params and metrics, with a tag
naming that run, so the sweep's table and the UI stay complete."""

from __future__ import annotations

from typing import Any

from orchestrator.tracking import Tracker, rate_step


def previous_successes(tracker: Tracker, hashes: set[str]) -> dict[str, Any]:
    """config hash -> the most recent successful (measured, not reused) trial run with that hash."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string="tags.`parasweep.kind` = 'trial' and tags.`parasweep.status` = 'ok'",
        order_by=["attributes.start_time DESC"], max_results=50000)
    found: dict[str, Any] = {}
    for run in runs:
        h = run.data.tags.get("parasweep.config_hash")
        if h in hashes and h not in found:
            found[h] = run
    return found


def record_reuse(tracker: Tracker, parent_run_id: str | None, num: int, label: str, previous: Any) -> str:
    tags = {k: v for k, v in previous.data.tags.items() if k.startswith("parasweep.")}
    tags.update({"parasweep.kind": "trial", "parasweep.status": "skipped", "parasweep.trial_num": str(num),
                 "parasweep.overrides": label, "parasweep.reused_run_id": previous.info.run_id})
    for stale in ("parasweep.trial_dir", "parasweep.error", "parasweep.cuda_visible_devices"):
        tags.pop(stale, None)  # they describe the earlier run's execution, not this reuse
    run_id = tracker.start_run(f"{num}: {label} (reused)", tags=tags, parent_run_id=parent_run_id)
    tracker.log_params(run_id, previous.data.params)
    points = [(k, v, 0) for k, v in previous.data.metrics.items() if "/" in k]
    # rebuild the step series (step = concurrency) from the per-point values
    series = [(k.split("/", 1)[1], v, int(k[1:k.index("/")])) for k, v, _ in points
              if k.startswith("c") and k[1:k.index("/")].isdigit()]
    series += [("open/" + k.split("/", 1)[1], v, rate_step(float(k[1:k.index("/")]))) for k, v, _ in points
               if k.startswith("r") and k[1:k.index("/")].replace(".", "", 1).isdigit()]
    tracker.log_metrics(run_id, points + series)
    tracker.finish(run_id, "skipped")
    return run_id
