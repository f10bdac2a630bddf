"""Real traffic for the load generator: datasets and timed traces, read into requests by index.

* ``tokenize``: text to token ids offline (the model's own tokenizer, or a bundled vocabulary);
* ``sharegpt``: ShareGPT V3 conversations (installed with the project), tokenized once, cached on disk;
* ``traces``: Mooncake JSONL and Azure CSV traces (slices shipped in ``data/traces/``, or a user's file);
* ``requests``: request ``i`` of a source (ids, output length), sessions of turns, the trace's times.
"""

from .requests import SourceRequest, SourceRequests, as_sessions, source_requests, trace_point

__all__ = ["SourceRequest", "SourceRequests", "as_sessions", "source_requests", "trace_point"]
