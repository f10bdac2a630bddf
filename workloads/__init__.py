"""parasweep's async load generator (see docs/loadgen.md).

Synchronous use from a trial::

    from workloads import LoadPoint, RequestSpec, run_point
    result = run_point(url, LoadPoint(num_requests=200, concurrency=8), RequestSpec(api="generate"))
    result.metrics["output_tok_s"], result.invalid_reasons
"""

from .metrics import SLO, summarize, validity_reasons
from .payloads import RequestSpec
from .records import ERROR_KINDS, RecordWriter, RequestRecord, read_records, records_to_dataframe
from .runner import PointResult, run_point, run_point_async
from .scheduler import LoadPoint

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
