"""Fault injection in the simulated engine, for real: each ``--sim-fault-*`` flag on a ``python -m
simulator`` process (the tiny test model, a free 127.0.0.1 port, its own process group), observed over
real HTTP with a plain client, and no process of it left afterwards.

Which requests meet a fraction fault is a function of the seed and the arrival number
(``simulator.faults.request_fault``); the tests send requests one at a time, compute the expected fault
of each from that function and check that exactly those requests meet it. Timing is only ever used as a
generous upper bound ("silent for 3 s" where tokens come every few ms; "within 15 s").
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from orchestrator.errors import EngineStartError
from orchestrator.process.server import ServerProcess
from simulator.faults import CUT, HTTP_ERROR, MALFORMED, STALL, FaultConf, request_fault
from tests.servers import processes_mentioning, simulator_process

pytestmark = pytest.mark.slow  # every test here starts server processes

READY_LINE = "The server is fired up and ready to roll!"
SILENCE_S = 3.0  # "no byte for this long" means silent: a token of the tiny model takes about 1 ms
SLOW = ["--sim-time-scale", "0.02"]  # about 40 ms per token: a long stream is still running when we look
# about 17 ms per token, 20 tokens: a stream's first write is never its last, however late the reader
PACED = ["--sim-time-scale", "0.05"]


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    assert not processes_mentioning(str(tmp_path)), "a simulator process outlived its test"


def _conn(server: ServerProcess, timeout: float) -> http.client.HTTPConnection:
    host, port = server.url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


class Stream:
    """One streamed request over its own connection, read as the bytes come."""

    def __init__(self, server: ServerProcess, path: str, body: dict, timeout: float = SILENCE_S) -> None:
        self.conn = _conn(server, timeout)
        self.conn.request("POST", path, orjson.dumps({**body, "stream": True}),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.data = b""

    def read_some(self) -> bytes:
        chunk = self.resp.read1(65536)
        self.data += chunk
        return chunk

    def first_tokens(self) -> None:
        """Read until the first event that carries a token has arrived (``/generate``)."""
        while b'"completion_tokens":' not in self.data:
            assert self.read_some(), self.data

    def finish(self) -> str:
        """Read to the end: ``ended`` (the body completed), ``cut`` (the connection closed before the body
        was complete) or ``silent`` (nothing for the read timeout while the connection stays open)."""
        try:
            while self.read_some():
                pass
        except TimeoutError:
            return "silent"
        except (http.client.IncompleteRead, ConnectionError):
            return "cut"
        return "ended"

    def events(self) -> list[bytes]:
        return [e.removeprefix(b"data: ") for e in self.data.split(b"\n\n") if e.strip()]

    def close(self) -> None:
        self.conn.close()


def _post(server: ServerProcess, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _health(server: ServerProcess, timeout: float = 5.0) -> int | None:
    """The status /health answers, or None if it gives no answer within ``timeout``."""
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except TimeoutError:
        return None


def _log(tmp: Path) -> str:
    return (tmp / "server.log").read_text(errors="replace")


def _wait_bound(server: ServerProcess, timeout_s: float = 15.0) -> None:
    """Until the port answers at all (any status): the process is up, ready or not."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(server.url + "/ready", timeout=5).close()
            return
        except urllib.error.HTTPError:  # an answer (503): bound, not ready
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert server.proc is not None and server.proc.poll() is None, _log(server.log_path.parent)
        assert time.monotonic() < deadline, "the simulator never bound its port"
        time.sleep(0.1)


GEN = {"text": "hello world", "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
GEN20 = {"text": "hello world", "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
LONG = {"text": "hello world", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}


# -- count faults --------------------------------------------------------------------------------------


def test_crash_after_n_requests_kills_the_process_and_drops_open_streams(tmp: Path) -> None:
    with simulator_process([*SLOW, "--sim-fault-crash-after-requests", "3"], tmp) as server:
        server.wait_ready(30)
        assert _post(server, "/generate", GEN)[0] == 200  # request 1
        open_stream = Stream(server, "/generate", LONG)  # request 2: still streaming at the crash
        open_stream.first_tokens()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):  # request 3: the crash
            Stream(server, "/v1/completions", {"prompt": "hi", "max_tokens": 4})
        assert open_stream.finish() == "cut"
        assert b"[DONE]" not in open_stream.data
        assert server.proc is not None
        assert server.proc.wait(timeout=15) == -9  # killed at once, as SGLang's launcher kills its tree
    log = _log(tmp)
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "RuntimeError: simulated scheduler failure at generation request 3" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log


def test_hang_after_n_requests_silences_every_stream_and_health(tmp: Path) -> None:
    env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}  # SGLang's knob; 20 s by default
    with simulator_process([*SLOW, "--sim-fault-hang-after-requests", "2"], tmp, env=env) as server:
        server.wait_ready(30)
        first = Stream(server, "/generate", LONG)  # request 1: running when the engine hangs
        first.first_tokens()
        second = Stream(server, "/v1/chat/completions",  # request 2: the hang
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        # accepted, then nothing
        assert second.resp.status == 200 and second.finish() == "silent"
        assert b'"delta":{"content"' not in second.data  # at most the role chunk, no token
        assert first.finish() == "silent" and b"[DONE]" not in first.data
        tokens = [json.loads(e)["meta_info"]["completion_tokens"] for e in first.events()]
        assert 0 < tokens[-1] < 4000
        third = Stream(server, "/generate", GEN)  # later requests hang too
        assert third.finish() == "silent" and third.data == b""
        # /health asks the engine for one token: none comes, so 503 after the health-check timeout
        assert _health(server, timeout=15) == 503
        assert server.proc is not None and server.proc.poll() is None  # deadlocked, not dead
        for s in (first, second, third):
            s.close()
        assert server.stop() == 0  # SIGTERM still stops it, without the SIGKILL fallback
    log = _log(tmp)
    assert "Simulated fault (--sim-fault-hang-after-requests 2)" in log
    assert "Health check failed. Server couldn't get a response from detokenizer for last 1 seconds." in log


# -- start-up faults -----------------------------------------------------------------------------------


def test_hang_before_ready_never_becomes_ready_but_stops_on_sigterm(tmp: Path) -> None:
    with simulator_process(["--sim-fault-hang-before-ready"], tmp) as server:
        _wait_bound(server)
        with pytest.raises(EngineStartError, match="not ready after 2 s"):
            server.wait_ready(2)
        assert _health(server) == 503
        with urllib.request.urlopen(server.url + "/server_info", timeout=5) as r:
            assert json.loads(r.read())["sim_faults"] == {"hang_before_ready": True}
        assert server.stop() == 0  # exits on SIGTERM by itself
    log = _log(tmp)
    assert READY_LINE not in log and "never becomes ready" in log


def test_startup_delay_holds_readiness_then_serves(tmp: Path) -> None:
    started = time.time()
    with simulator_process(["--sim-fault-startup-delay-s", "3"], tmp) as server:
        _wait_bound(server)
        if time.time() - started < 2.5:  # bound well before the delay ends (a slow machine may not be)
            assert _health(server) == 503
        server.wait_ready(30)
        assert time.time() - started >= 3.0  # never ready before the delay
        assert _post(server, "/generate", GEN)[0] == 200
    assert READY_LINE in _log(tmp)


def test_oom_at_start_logs_cuda_oom_and_exits_1(tmp: Path) -> None:
    with (simulator_process(["--sim-fault-oom-at-start"], tmp) as server,
          pytest.raises(EngineStartError, match="exited with code 1 before it was ready") as info):
        server.wait_ready(30)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in str(info.value)
    log = _log(tmp)
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "Received sigquit from a child process" in log and READY_LINE not in log


# -- fraction faults -----------------------------------------------------------------------------------


def _plan(flags: list[str], seed: int, n: int) -> list[str | None]:
    conf = FaultConf(**{
        name.removeprefix("--sim-fault-").replace("-", "_"): float(value)
        for name, value in zip(flags[::2], flags[1::2], strict=True)})
    return [request_fault(conf, seed, i) for i in range(1, n + 1)]


def test_stalled_streams_go_silent_while_the_others_go_on(tmp: Path) -> None:
    flags, seed, n = ["--sim-fault-stall-stream-fraction", "0.4"], 5, 8
    plan = _plan(flags, seed, n)
    assert 0 < plan.count(STALL) < n  # the seed gives both kinds (a fixed function of it)
    with simulator_process([*PACED, *flags, "--random-seed", str(seed)], tmp) as server:
        server.wait_ready(30)
        streams = []
        for _ in range(n):  # one at a time: arrival order is request order; stalled ones stay open
            s = Stream(server, "/generate", GEN20)
            streams.append((s, s.finish()))
        for (s, outcome), fault in zip(streams, plan, strict=True):
            if fault == STALL:
                assert outcome == "silent" and b"[DONE]" not in s.data
                assert b'"completion_tokens":' in s.data  # it sent a first part
            else:
                assert outcome == "ended" and s.data.endswith(b"data: [DONE]\n\n")
            s.close()


def test_cut_streams_lose_their_connection_mid_way(tmp: Path) -> None:
    flags, seed, n = ["--sim-fault-cut-stream-fraction", "0.5"], 3, 10
    plan = _plan(flags, seed, n)
    assert 0 < plan.count(CUT) < n
    with simulator_process([*PACED, *flags, "--random-seed", str(seed)], tmp) as server:
        server.wait_ready(30)
        for fault in plan:
            s = Stream(server, "/v1/completions", {"prompt": "hello", "max_tokens": 20})
            outcome = s.finish()
            s.close()
            if fault == CUT:
                assert outcome == "cut" and b"[DONE]" not in s.data
                assert not any(json.loads(e)["choices"][0]["finish_reason"] for e in s.events())
            else:
                assert outcome == "ended" and s.data.endswith(b"data: [DONE]\n\n")
        assert _post(server, "/generate", GEN)[0] == 200  # the server itself is fine


def test_malformed_events_appear_once_and_the_stream_goes_on(tmp: Path) -> None:
    flags, seed, n = ["--sim-fault-malformed-sse-fraction", "0.5"], 2, 8
    plan = _plan(flags, seed, n)
    assert 0 < plan.count(MALFORMED) < n
    with simulator_process([*flags, "--random-seed", str(seed)], tmp) as server:
        server.wait_ready(30)
        for fault in plan:
            s = Stream(server, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
            assert s.finish() == "ended" and s.data.endswith(b"data: [DONE]\n\n")
            s.close()
            bad = []
            for event in s.events()[:-1]:  # all but [DONE]
                try:
                    json.loads(event)
                except ValueError:
                    bad.append(event)
            assert len(bad) == (1 if fault == MALFORMED else 0), s.data


def _error_outcomes(server: ServerProcess, n: int) -> list[int]:
    """Status of n requests, alternating the three generation endpoints (non-streamed)."""
    bodies = [("/generate", GEN), ("/v1/completions", {"prompt": "hi", "max_tokens": 3}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})]
    statuses = []
    for i in range(n):
        path, body = bodies[i % 3]
        status, reply = _post(server, path, body)
        statuses.append(status)
        if status == 500:  # SGLang's error bodies: native and OpenAI
            message = reply["error"]["message"] if path == "/generate" else reply["message"]
            assert "--sim-fault-http-error-fraction" in message
            if path != "/generate":
                assert reply["object"] == "error" and reply["code"] == 500
    return statuses


def test_http_errors_hit_the_same_requests_for_the_same_seed(tmp: Path) -> None:
    flags, n = ["--sim-fault-http-error-fraction", "0.3"], 12
    plans = {seed: _plan(flags, seed, n) for seed in (1, 4)}
    assert plans[1] != plans[4] and all(0 < p.count(HTTP_ERROR) < n for p in plans.values())
    seen = []
    for run, seed in enumerate((1, 1, 4)):
        (tmp / str(run)).mkdir()
        with simulator_process([*flags, "--random-seed", str(seed)], tmp / str(run)) as server:
            server.wait_ready(30)
            statuses = _error_outcomes(server, n)
        assert statuses == [500 if f == HTTP_ERROR else 200 for f in plans[seed]]
        seen.append(statuses)
    assert seen[0] == seen[1] != seen[2]  # reproducible for a seed, different for another
