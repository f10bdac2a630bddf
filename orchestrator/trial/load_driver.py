"""Stage 3, *load driver*: every load point of the plan, in order, against an engine session.

Records are appended to ``records/requests.jsonl`` as requests finish (by the load generator, or by
the virtual session), so an interrupted trial keeps every finished request. Each point's result is
handed to ``on_point`` as soon as it is known, so its metrics are logged before the next point starts;
so is a point cut short by an :class:`~orchestrator.errors.EngineFailure` (marked invalid), before the
failure ends the trial's load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from orchestrator.errors import EngineFailure
from orchestrator.progress import ProgressWriter
from orchestrator.trial.session import EngineSession
from vocab.load import LoadPoint, RequestSpec
from vocab.records import PointResult

log = logging.getLogger("parasweep")

SUMMARY_KEYS = ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "achieved_concurrency", "errors", "valid")


def drive_load(session: EngineSession, points: list[LoadPoint], spec: RequestSpec, records: Path,
               progress: ProgressWriter, on_point: Callable[[PointResult], None]) -> list[PointResult]:
    results: list[PointResult] = []
    for i, point in enumerate(points):
        progress.update(status="running", point=point.label, point_index=i, points_total=len(points),
                        done=0, total=point.num_requests, force=True)

        def on_progress(done: int, total: int) -> None:
            progress.update(done=done, total=total)

        try:
            result = session.run_point(point, spec, records, on_progress)
        except EngineFailure as failure:
            if failure.result is not None:  # what the point measured before it was cut short
                results.append(failure.result)
                on_point(failure.result)
            raise
        results.append(result)
        on_point(result)
        log.debug("%s: %s", point.label, ", ".join(f"{k}={result.metrics[k]:.4g}" for k in SUMMARY_KEYS
                                                   if k in result.metrics))
    return results
