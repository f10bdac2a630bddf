"""Waiting for a stopped engine's GPUs to be free, and checking them free of other processes before a
launch: CVD -> NVML mapping and polling, with a fake NVML (no GPU here; the real module is exercised
on a GPU node) and the real one's no-driver path."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.errors import EngineStartError
from orchestrator.gpu_release import ensure_gpus_free, process_group_pids, wait_gpus_free

pytestmark = pytest.mark.slow  # real process groups


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Four GPUs; ``procs[i]`` is a list of pid lists, one popped per poll (the last one stays)."""

    NVMLError = FakeNVMLError

    def __init__(self, procs: dict[int, list[list[int]]], fail_init: bool = False) -> None:
        self.procs, self.fail_init = procs, fail_init
        self.uuids = [f"GPU-{i}aaa-bbbb" for i in range(4)]
        self.polls: list[int] = []
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuids[h]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        self.polls.append(h)
        queue = self.procs.get(h, [[]])
        pids = queue.pop(0) if len(queue) > 1 else queue[0]
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_waits_until_the_engine_processes_leave() -> None:
    nvml, clock = FakeNVML({2: [[11, 12], [12], []], 3: [[13], []]}), Clock()
    warnings = wait_gpus_free("2,3", 30, {11, 12, 13}, nvml=nvml, clock=clock, sleep=clock.sleep)
    assert warnings == []
    assert set(nvml.polls) == {2, 3} and clock.t == 1.0  # two sleeps of 0.5 s
    assert nvml.shutdown


def test_uuid_entries_and_only_own_pids() -> None:
    nvml, clock = FakeNVML({1: [[99]]}), Clock()  # pid 99 is not ours: not waited for
    assert wait_gpus_free("GPU-1aaa", 30, {5}, nvml=nvml, clock=clock, sleep=clock.sleep) == []
    assert nvml.polls == [1]


def test_timeout_reports_what_is_left() -> None:
    nvml, clock = FakeNVML({0: [[7]]}), Clock()
    warnings = wait_gpus_free("0,9,MIG-zzz,GPU-", 2, None, nvml=nvml, clock=clock, sleep=clock.sleep)
    assert any("entry '9' is past NVML's 4 GPU(s)" in w and w.endswith("; not checked") for w in warnings)
    assert any("'MIG-zzz' matches no GPU" in w for w in warnings)
    assert any("'GPU-' is a prefix of 4 GPUs' UUIDs" in w for w in warnings)  # ambiguous: not guessed
    assert nvml.polls and set(nvml.polls) == {0}
    assert warnings[-1] == "GPUs still in use 2 s after the engine stopped (GPU 0: pids 7)"
    assert clock.t >= 2


def test_no_cvd_means_every_gpu_and_empty_cvd_means_none() -> None:
    nvml, clock = FakeNVML({}), Clock()
    assert wait_gpus_free(None, 1, nvml=nvml, clock=clock, sleep=clock.sleep) == []
    assert sorted(nvml.polls) == [0, 1, 2, 3]
    assert wait_gpus_free("", 1, nvml=FakeNVML({}, fail_init=True)) == []


def test_without_nvml_returns_at_once() -> None:
    assert wait_gpus_free("0", 60, nvml=FakeNVML({0: [[1]]}, fail_init=True)) == []
    start = time.monotonic()
    assert wait_gpus_free("0,1", 60, {1}) == []  # the real pynvml: no driver on this machine
    assert time.monotonic() - start < 5


def test_process_group_pids_lists_the_group() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                             "time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        pids: set[int] = set()
        while time.monotonic() < deadline and len(pids) < 2:
            pids = process_group_pids(proc.pid)
            time.sleep(0.05)
        assert proc.pid in pids and len(pids) == 2 and os.getpid() not in pids
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


# -- before an SGLang launch: the trial's GPUs must hold no other process --------------------------
def test_launch_waits_for_a_leftover_to_let_go() -> None:
    nvml, clock, heard = FakeNVML({1: [[4242], [4242], []]}), Clock(), []
    assert ensure_gpus_free("1", 60, nvml=nvml, clock=clock, sleep=clock.sleep, on_wait=heard.append) == []
    assert clock.t == 1.0 and nvml.shutdown
    assert heard == ["waiting up to 60 s for GPUs held by other processes (GPU 1: pids 4242)"]


def test_launch_fails_naming_the_gpus_and_pids_still_held() -> None:
    nvml, clock = FakeNVML({0: [[7, 8]], 2: [[9]], 3: [[]]}), Clock()
    with pytest.raises(EngineStartError) as err:
        ensure_gpus_free("0,2,3", 5, nvml=nvml, clock=clock, sleep=clock.sleep)
    assert str(err.value) == ("GPUs not free before the engine start (GPU 0: pids 7, 8; GPU 2: pids 9; "
                              "still held after 5 s): a leftover of an earlier trial or another program; "
                              "see nvidia-smi")
    assert clock.t >= 5 and set(nvml.polls) == {0, 2, 3}


def test_launch_check_on_free_gpus_and_without_nvml() -> None:
    nvml, clock = FakeNVML({}), Clock()
    warnings = ensure_gpus_free("1,9", 60, nvml=nvml, clock=clock, sleep=clock.sleep)
    assert clock.t == 0 and any("entry '9' is past NVML's 4 GPU(s)" in w for w in warnings)
    assert ensure_gpus_free("0", 60, nvml=FakeNVML({0: [[1]]}, fail_init=True)) == []
    assert ensure_gpus_free("", 60, nvml=FakeNVML({0: [[1]]})) == []  # the engine sees no GPU
    start = time.monotonic()
    assert ensure_gpus_free("0", 60) == []  # the real pynvml: no driver on this machine
    assert time.monotonic() - start < 5


_SLOW_HEALTH = """
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(2.5)  # longer than a 2 s client timeout, well within SGLang's own 20 s check
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_readiness_waits_for_a_health_answer_as_slow_as_sglangs_own_check(tmp_path: Path) -> None:
    from orchestrator.process.server import ServerProcess, free_port

    port = free_port("127.0.0.1")
    with ServerProcess([sys.executable, "-c", _SLOW_HEALTH, str(port)], tmp_path / "server.log", "127.0.0.1",
                       port, stop_grace_s=2.0) as server:
        server.wait_ready(20)  # every answer takes 2.5 s: a client that gave up at 2 s never saw one
        assert server.proc is not None and server.proc.poll() is None
