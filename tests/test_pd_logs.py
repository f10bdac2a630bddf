"""A disaggregated server's batch lines and gauges as SGLang 0.5.23 writes them: each PD fragment of the
simulated engine's lines is one of the release's own recorded format strings, in the release's order, and
parasweep's log parser reads the queues back by name."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.telemetry.server_log import parse_log_line
from simulator.entities import PDQueues
from simulator.logs import decode_line, prefill_line

RELEASES = Path(__file__).resolve().parent.parent / "orchestrator/engines/sglang_compat/releases"
RELEASE = RELEASES / "sglang-0.5.23.json"


def _formats() -> str:
    return " ".join(f["source"] for f in json.loads(RELEASE.read_text())["log_formats"])


def test_the_prefill_servers_line_adds_its_queues_as_sglang_does() -> None:
    line = prefill_line(2, 4096, 0, 0.25, 0, 3, 8192, 1234.5, PDQueues(bootstrap=5, inflight=2))
    recorded = _formats()
    for fragment in ("#bootstrap-req: ", "#inflight-req: ", "#optimistic-req: "):
        assert f'f"{fragment}{{' in recorded  # SGLang's own f-string starts so
    assert line.index("#bootstrap-req") < line.index("#inflight-req") < line.index("#optimistic-req") \
        < line.index("cuda graph")
    fields = parse_log_line(f"[2026-12-05 12:00:00] {line}")
    assert fields is not None
    assert (fields["bootstrap_req"], fields["inflight_req"], fields["queue_req"]) == (5, 2, 3)


def test_the_decode_servers_line_adds_its_preallocation_and_transfer_queues() -> None:
    queues = PDQueues(prealloc=4, transfer=3, preallocated_tokens=6000)
    line = decode_line(16, 50_000, 0.5, True, 800.0, 1, None, (0.06, queues))
    recorded = _formats()
    for fragment in ("pre-allocated usage: ", "#prealloc-req: ", "#transfer-req: ", "#retracted-req: "):
        assert f'f"{fragment}{{' in recorded
    assert line.index("token usage") < line.index("pre-allocated usage") < line.index("#prealloc-req") \
        < line.index("#transfer-req") < line.index("#retracted-req") < line.index("cuda graph")
    fields = parse_log_line(f"[2026-12-05 12:00:00] {line}")
    assert fields is not None
    assert (fields["prealloc_req"], fields["transfer_req"], fields["queue_req"]) == (4, 3, 1)
    assert abs(fields["pre_allocated_usage"] - 0.06) < 1e-9
