"""Stopping a load point early (``run_point(..., should_stop=...)``) against real server processes:
the simulated engine, slowed down so a point outlasts the stop, and the misbehaving fake server for
a stalled stream's error. The stop is asked every 0.2 s and fires on counts (finished requests, requests
the engine holds), never on a time this machine's pace would move; the outcomes (records, reasons,
nothing sent afterwards) are exact."""

from __future__ import annotations

import gc
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import fake_server, started

from orchestrator.process.server import free_port
from workloads import LoadPoint, RequestSpec, clock, read_records, run_point

REPO = Path(__file__).resolve().parents[1]
# a request of 400 tokens takes several seconds at 1/20 of the simulated engine's speed
SLOW = RequestSpec(api="generate", input_len=16, output_len=400)


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "simulator", "--model-path", str(REPO / "models" / "tiny-test"),
            "--served-model-name", "tiny-test", "--sim-hardware", "rtx-pro-6000-pcie-x8",
            "--sim-time-scale", "0.05", "--enable-metrics", "--host", "127.0.0.1", "--port", str(port)]
    with started(argv, port) as url:
        yield url


def _running(url: str) -> float:
    """Requests the engine holds (all PP slots), from its /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("parasweep_sim:num_running_reqs_all_slots"))


def _wait_idle(url: str, timeout_s: float = 15.0) -> float:
    deadline = time.monotonic() + timeout_s
    while (running := _running(url)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return running


class StopAfter:
    """``should_stop`` for the tests: a reason once ``done`` measured requests finished (or at once)."""

    def __init__(self, done: int, reason: str = "test stop") -> None:
        self.done, self.reason = done, reason
        self.finished = 0
        self.fired_at: float | None = None

    def progress(self, done: int, total: int) -> None:
        self.finished = done

    def __call__(self) -> str | None:
        if self.finished >= self.done:
            self.fired_at = self.fired_at or clock.now()  # the records' clock, not time.time()
            return self.reason
        return None


@pytest.mark.slow
def test_closed_loop_stop_keeps_finished_and_records_in_flight_as_aborted(slow_engine: str,
                                                                          tmp_path: Path) -> None:
    records = tmp_path / "requests.jsonl"
    stop = StopAfter(4, "engine exited with code -9")
    point = LoadPoint(num_requests=40, concurrency=4)
    res = run_point(slow_engine, point, SLOW, records_path=records, on_progress=stop.progress,
                    should_stop=stop)
    returned = clock.now()
    assert stop.fired_at is not None and returned - stop.fired_at < 10  # design: within 0.2 s
    aborted = [r for r in res.records if r.error_kind == "aborted"]
    done = [r for r in res.records if r.error is None]
    # closed loop keeps 4 in flight: those 4 are the unanswered ones, nothing else was sent
    assert len(aborted) == 4 and len(done) >= 4 and len(res.records) == len(done) + 4
    assert all(r.error == "aborted: engine exited with code -9" for r in aborted)
    assert all(r.send_time is not None and r.end_time is not None and r.end_time >= stop.fired_at - 1
               for r in aborted)
    assert res.invalid_reasons[0] == "stopped early: engine exited with code -9"
    assert res.metrics["valid"] == 0 and res.metrics["errors_aborted"] == 4
    # every request sent is in the records file, finished or not, and nothing is added later
    on_disk = list(read_records(records))
    assert sorted(r.index for r in on_disk) == sorted(r.index for r in res.records)
    time.sleep(1.0)
    assert len(list(read_records(records))) == len(on_disk)
    # the connections were closed: the engine dropped the aborted requests
    assert _wait_idle(slow_engine) == 0


@pytest.mark.slow
def test_the_first_question_is_asked_after_the_points_full_collection(slow_engine: str) -> None:
    # the first question starts the point's time (workload.point_timeout_s, orchestrator's
    # EngineWatch): the full collection before a point, seconds in a large process on a busy machine,
    # must come before it. After it, what exists is frozen out of the collector's sight.
    frozen: list[int] = []

    def should_stop() -> str:
        frozen.append(gc.get_freeze_count())
        return "stopped at the first question"

    res = run_point(slow_engine, LoadPoint(num_requests=4, concurrency=1), SLOW, should_stop=should_stop)
    assert frozen and frozen[0] > 0
    assert res.records == [] and res.invalid_reasons[0] == "stopped early: stopped at the first question"
    assert gc.get_freeze_count() == 0  # unfrozen again after the point


@pytest.mark.slow
def test_open_loop_stop_cancels_the_requests_in_flight_and_sends_no_more(slow_engine: str,
                                                                         tmp_path: Path) -> None:
    records = tmp_path / "requests.jsonl"
    point = LoadPoint(num_requests=200, rate=10.0, arrival="constant")  # 20 s of sends
    stop = StopWhenRunning(slow_engine, 5)  # a count the engine reports, not a time this machine sets

    res = run_point(slow_engine, point, SLOW, records_path=records, should_stop=stop)
    assert stop.fired_at is not None
    aborted = [r for r in res.records if r.error_kind == "aborted"]
    # at least 5 were running when the stop fired, each still streaming (a request takes seconds at
    # this engine's speed): every request sent was aborted, and the point ended long before its 200
    assert len(aborted) >= 5 and len(aborted) == len(res.records) < 200
    assert all(r.scheduled_time is not None and r.scheduled_time <= stop.fired_at
               for r in res.records)  # no send after the stop
    time.sleep(1.0)
    assert len(list(read_records(records))) == len(res.records)
    assert res.invalid_reasons[0] == "stopped early: enough are running"
    assert _wait_idle(slow_engine) == 0


class StopWhenRunning:
    """``should_stop`` for the tests: a reason once the engine holds ``running`` requests (its /metrics),
    and from then on."""

    def __init__(self, url: str, running: int) -> None:
        self.url, self.running = url, running
        self.fired_at: float | None = None

    def __call__(self) -> str | None:
        if self.fired_at is None and _running(self.url) >= self.running:
            self.fired_at = clock.now()  # the records' clock, not time.time()
        return "enough are running" if self.fired_at is not None else None


@pytest.mark.slow
def test_a_reason_before_the_start_sends_nothing(slow_engine: str, tmp_path: Path) -> None:
    records = tmp_path / "requests.jsonl"
    res = run_point(slow_engine, LoadPoint(num_requests=8, concurrency=2), SLOW, records_path=records,
                    should_stop=lambda: "engine exited with code 1")
    assert res.records == [] and res.metrics["num_requests"] == 0
    assert res.invalid_reasons[0] == "stopped early: engine exited with code 1"
    assert not records.exists() or records.read_bytes() == b""


@pytest.mark.slow
def test_a_stalled_stream_names_the_setting_that_bounds_it() -> None:
    with fake_server(mode="hang", every=2) as server:
        res = run_point(server.url, LoadPoint(num_requests=4, concurrency=2),
                        RequestSpec(api="generate", output_len=4), sock_read_timeout=1.0,
                        read_timeout_setting="workload.stall_timeout_s")
    stalled = [r for r in res.records if r.error]
    assert len(stalled) == 2 and len(res.records) == 4  # the point went on past the stalls
    assert all(r.error_kind == "timeout" and r.error == "stalled: no data for 1 s (workload.stall_timeout_s)"
               for r in stalled)
    assert not any(r.startswith("stopped early") for r in res.invalid_reasons)


def test_should_stop_needs_one_process() -> None:
    with pytest.raises(ValueError, match="should_stop needs workers=1"):
        run_point("http://127.0.0.1:9", LoadPoint(num_requests=4, concurrency=2), RequestSpec(),
                  workers=2, should_stop=lambda: None)
