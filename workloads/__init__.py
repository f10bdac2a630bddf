"""parasweep's async load generator (see docs/loadgen.md).

Synchronous use from a trial::

    from workloads import LoadPoint, RequestSpec, run_point
    result = run_point(url, LoadPoint(num_requests=200, concurrency=8), RequestSpec(api="generate"))
    result.metrics["output_tok_s"], result.invalid_reasons
"""

# The load generator speaks the shared vocabulary: points, specs and records are defined in vocab/
# and re-exported here, so a user of the load generator needs only this package.
from vocab.load import LoadPoint, RequestSpec
from vocab.records import (
    ERROR_KINDS,
    PointResult,
    RecordWriter,
    RequestRecord,
    read_records,
    records_to_dataframe,
)

from .metrics import SLO, summarize, validity_reasons
from .runner import run_point, run_point_async

__all__ = [
    "ERROR_KINDS",
    "SLO",
    "LoadPoint",
    "PointResult",
    "RecordWriter",
    "RequestRecord",
    "RequestSpec",
    "read_records",
    "records_to_dataframe",
    "run_point",
    "run_point_async",
    "summarize",
    "validity_reasons",
]
