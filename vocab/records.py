"""Per-request records and a load point's result: the raw material every metric is computed from.

Records keep per-chunk arrival times *and* per-chunk token counts, so latency metrics can be
re-expressed later under another tool's convention (per-token vs per-chunk ITL) without
re-running anything. They are appended to a JSONL file as each request finishes, so a crashed
or killed trial still leaves every finished request on disk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import orjson

from vocab.load import LoadPoint

if TYPE_CHECKING:
    import pandas as pd

# How a point's first invalid reason starts when the point did not run its course: the load generator
# stopped it (the trial's watcher said the engine died or hung, or the point ran out of time), or the
# engine was found dead just after it ended. Such a point is the trial's failure, not the client's.
STOPPED_EARLY = "stopped early: "
ENGINE_FAILED = "engine failed: "

# Every kind an error can have. ``client`` is an unexpected exception inside the load generator
# itself (a bug, reported rather than crashing the point); ``aborted`` is a request still in flight
# when its point was stopped early (the engine died or hung, or the point ran out of time).
ERROR_KINDS: tuple[str, ...] = (
    "http_5xx",
    "http_4xx",
    "malformed",
    "disconnected",
    "timeout",
    "connect",
    "server_error",
    "client",
    "aborted",
)


# the parts of a disaggregated request's TTFT, in order: waiting for the decode server's pre-allocation,
# queueing on the prefill server, its prefill, the KV transfer, the decode server's first step
PD_TTFT_PARTS = ("bootstrap", "prefill_queue", "prefill", "transfer", "decode_first")


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are epoch seconds on the load generator's clock (virtual
    seconds in a prediction).

    ``first_byte_time`` is when the response headers arrived; ``first_token_time`` is the arrival
    of the first chunk that carried at least one output token (role-only and usage-only chunks do
    not count). ``chunk_times[i]`` is the arrival of one network read that completed at least one
    SSE event and ``chunk_tokens[i]`` the output tokens those events carried (may be 0).
    ``scheduled_time`` is the intended send time in open loop (None in closed loop).
    ``server_queue_s`` is the server's own report of the seconds the request waited in its queue
    before its first forward (SGLang's ``/generate`` ``meta_info.queue_time``); None when the server
    does not report it (other APIs, metrics off). ``cached_tokens`` is the server's report of the
    prompt tokens it found in its prefix cache (``/generate``'s ``meta_info.cached_tokens``, or an
    OpenAI usage's ``prompt_tokens_details.cached_tokens``); None when it reports none. ``pd_parts_s``
    is a disaggregated deployment's account of the request's TTFT, in ``PD_TTFT_PARTS`` order (engine
    seconds; the simulated decode server's ``meta_info.sim_pd_*_s``); None elsewhere.
    """

    point: str
    index: int
    warmup: bool = False
    scheduled_time: float | None = None
    send_time: float | None = None
    first_byte_time: float | None = None
    first_token_time: float | None = None
    end_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None
    http_status: int | None = None
    server_queue_s: float | None = None
    cached_tokens: int | None = None
    pd_parts_s: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class RecordWriter:
    """Appends one JSON line per finished request and flushes it at once.

    Flushing per line costs one ``write`` syscall per request (cheap next to a streamed LLM
    response) and means nothing finished is lost if the process dies.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] | None = self.path.open("ab")

    def write(self, record: RequestRecord) -> None:
        if self._fh is None:
            raise ValueError("RecordWriter is closed")
        self._fh.write(record.to_json() + b"\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path | str) -> Iterator[RequestRecord]:
    """Records from a JSONL file; a torn last line (process killed mid-write) is skipped."""
    with Path(path).open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                yield RequestRecord.from_dict(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue


def records_to_dataframe(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """One row per request; ``chunk_times``/``chunk_tokens`` stay list columns (Parquet-ready)."""
    import pandas as pd  # imported lazily: the hot path and the CLI do not need pandas

    columns = [f.name for f in dataclasses.fields(RequestRecord)]
    rows = [{name: getattr(r, name) for name in columns} for r in records]
    return pd.DataFrame(rows, columns=columns)


@dataclass
class PointResult:
    """Outcome of one load point. ``invalid_reasons`` is empty iff ``metrics['valid'] == 1``.

    ``start``/``end`` bound the point's window on the records' clock (epoch seconds when measured,
    virtual seconds when predicted); telemetry is summarised over that window. 0 when unknown."""

    point: LoadPoint
    metrics: dict[str, float]
    invalid_reasons: list[str] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons
