"""What the GPU sampler costs the trial's process: its CPU time, and the load generator's throughput
with it running next to the load generator on the same core.

    .venv/bin/python benchmarks/gpu_sampler_bench.py [--nvml | --h200-costs] [--gpus 8] [--hz 10]
        [--seconds 8] [--reps 5] [--json F]

(a) CPU: ``GpuSampler`` + ``NvmlReader`` at ``--hz`` over ``--gpus`` GPUs, writing its JSONL as in a
trial, for ``--seconds``; the sampler thread's own CPU time (its POSIX thread CPU clock) and the
whole process's CPU time against an idle window of the same length measured just before,
both as CPU seconds per minute of wall time; twice, the reference first: the energy counter read at
every sample (as the sampler did before), then as it reads it now (once a second and at the marks), and
the ratio of the two per sample. Without ``--nvml`` the reader runs on the pynvml stand-in of the tests
(``tests/fake_nvml.py``): the reader's decoding, the sampler and the file writes are measured, the real
NVML calls (ctypes into the driver, which queries the GPU) are NOT, unless ``--h200-costs`` makes each
stand-in call spend the CPU time that call took on a real H200 (``H200_CALL_US``). On a GPU machine
pass ``--nvml`` to use the real library over this node's first ``--gpus`` GPUs.

(b) Load generator: the loopback server (``python -m workloads.loopback``, 1 ms to the first token,
1 ms apart, pinned to the first CPU) and, in this process pinned to the second CPU, the load
generator's ``run_point`` (closed loop, concurrency 64, 8-token streams: the client's core is the
limit, so CPU taken by the sampler shows as lost requests/s). ``--reps`` pairs, without and with the
sampler back to back (the first alternating), after a warm-up; the ratio with/without per pair, then
the median. This is the trial's layout: ``run_point`` with one worker runs in the trial's process,
where the sampler thread runs.

About 45 s on a 2-core machine. Prints ratios against a reference measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from loadgen_common import REPO, cpus, loopback

from orchestrator.telemetry.gpu_sampler import ENERGY_EVERY_S, GpuSampler
from orchestrator.telemetry.nvml_source import NvmlReader
from vocab.load import LoadPoint, RequestSpec
from workloads import run_point

CONCURRENCY, REQUESTS, OUTPUT_LEN = 64, 15000, 8  # about 2 s a run on one core


def _stand_in(gpus: int) -> Any:
    """The tests' pynvml stand-in with ``gpus`` GPUs whose counters move (loaded by file path: the
    tests folder is not a package)."""
    spec = importlib.util.spec_from_file_location("fake_nvml", REPO / "tests" / "fake_nvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_nvml"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    devices = [module.FakeGpu(f"GPU-{i:08d}-0000-0000-0000-000000000000", energy_step_mj=20_000,
                              pcie_tx_step=1 << 20, pcie_rx_step=1 << 19, util_gpu=90, reasons=0x4)
               for i in range(gpus)]
    return module.FakeNvml(devices).module()


# CPU time of one call on a real H200 (driver 580.159.04, nvidia-ml-py 13), measured call by call:
# what --h200-costs makes the stand-in spend. nvmlDeviceGetFieldValues costs the sum of its fields'
# (the energy counter, field 83, as GetTotalEnergyConsumption; instant power, 186, as GetPowerUsage;
# the PCIe byte counters, 197 and 198, were not timed alone: 0 here).
H200_CALL_US = {"nvmlDeviceGetTotalEnergyConsumption": 3823.0, "nvmlDeviceGetPowerUsage": 0.96,
                "nvmlDeviceGetUtilizationRates": 0.90, "nvmlDeviceGetMemoryInfo": 5.4,
                "nvmlDeviceGetClockInfo": 1.1, "nvmlDeviceGetTemperature": 1.1,
                "nvmlDeviceGetCurrentClocksEventReasons": 0.97,
                "nvmlDeviceGetCurrentClocksThrottleReasons": 0.97}
H200_FIELD_US = {83: 3823.0, 186: 0.96}


def _spin(us: float) -> None:
    """Burn ``us`` microseconds of this thread's CPU (what the driver call would take)."""
    end = time.thread_time() + us * 1e-6
    while time.thread_time() < end:
        pass


class _CostlyNvml:
    """The stand-in's module, each call spending the CPU time it takes on a real H200 (H200_CALL_US)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name == "nvmlDeviceGetFieldValues":
            def fields(handle: Any, ids: list[int]) -> Any:
                _spin(sum(H200_FIELD_US.get(int(i), 0.0) for i in ids))
                return value(handle, ids)
            return fields
        if name in H200_CALL_US:
            def call(*args: Any, **kwargs: Any) -> Any:
                _spin(H200_CALL_US[name])
                return value(*args, **kwargs)
            return call
        return value


def _reader(a: argparse.Namespace) -> NvmlReader:
    if a.nvml:
        return NvmlReader.open(None, a.gpus)
    stand_in = _stand_in(a.gpus)
    return NvmlReader.open(None, a.gpus, nvml=_CostlyNvml(stand_in) if a.h200_costs else stand_in)


def _thread_cpu_s(thread: threading.Thread) -> float:
    """CPU time of another thread, to the nanosecond (its POSIX CPU-time clock; /proc's per-thread
    times, which psutil reads, come in 10 ms ticks: too coarse for a few seconds of sampling)."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def cpu_cost(a: argparse.Namespace, tmp: Path, energy_every_s: float) -> dict[str, float]:
    """(a): CPU seconds per minute of wall time, the sampler thread's own and the process's excess, with
    the energy counter read every ``energy_every_s`` (0: at every sample)."""
    reader = _reader(a)
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(a.seconds)  # the idle baseline: this process with nothing running
    idle_wall, idle_cpu = time.perf_counter() - t0, time.process_time() - c0

    sampler = GpuSampler(reader, tmp / "cpu.jsonl", hz=a.hz, energy_every_s=energy_every_s)
    t0, c0 = time.perf_counter(), time.process_time()
    sampler.start()
    thread = next(t for t in threading.enumerate() if t.name == "gpu-sampler")
    time.sleep(a.seconds)
    thread_cpu = _thread_cpu_s(thread)  # before stop(): the clock goes with the thread
    sampler.stop()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    per_min = 60.0 / wall
    return {
        "energy_every_s": energy_every_s,
        "gpus": a.gpus, "hz": a.hz, "seconds": wall, "samples": sampler.samples, "errors": sampler.errors,
        "thread_cpu_s_per_min": thread_cpu * per_min,
        "process_cpu_s_per_min": cpu * per_min,
        "idle_process_cpu_s_per_min": idle_cpu * 60.0 / idle_wall,
        "excess_cpu_s_per_min": cpu * per_min - idle_cpu * 60.0 / idle_wall,
        "thread_cpu_ms_per_sample": 1000.0 * thread_cpu / max(1, sampler.samples - 1),
    }


def _point(url: str, requests: int) -> dict[str, float]:
    spec = RequestSpec(api="generate", input_len=16, output_len=OUTPUT_LEN, model="loopback")
    res = run_point(url, LoadPoint(num_requests=requests, concurrency=CONCURRENCY), spec)
    return {k: res.metrics[k] for k in ("request_s", "client_lag_p99_ms", "ttft_p99_ms")}


def loadgen_impact(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """(b): the load generator's requests/s without and with the sampler in this process."""
    server_cpu, client_cpu = cpus()
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})  # this thread; the sampler thread inherits it
    runs: list[dict[str, Any]] = []
    with loopback(1.0, 1.0, server_cpu) as url:
        _point(url, REQUESTS // 4)  # warm-up: first connections, caches
        for rep in range(a.reps):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for with_sampler in order:
                sampler = GpuSampler(_reader(a), tmp / f"load{rep}.jsonl", hz=a.hz) if with_sampler else None
                if sampler:
                    sampler.start()
                try:
                    got = _point(url, REQUESTS)
                finally:
                    if sampler:
                        sampler.stop()
                runs.append({"rep": rep, "sampler": with_sampler, **got})
                print(f"  rep {rep + 1} {'with' if with_sampler else 'without':>7} sampler: "
                      f"{got['request_s']:7,.0f} req/s  loop lag p99 {got['client_lag_p99_ms']:5.1f} ms  "
                      f"TTFT p99 {got['ttft_p99_ms']:5.1f} ms", flush=True)
    pairs = [(next(r for r in runs if r["rep"] == rep and not r["sampler"]),
              next(r for r in runs if r["rep"] == rep and r["sampler"])) for rep in range(a.reps)]
    return {
        "server_cpu": server_cpu, "client_cpu": client_cpu, "runs": runs,
        "request_s_ratio": statistics.median(w["request_s"] / wo["request_s"] for wo, w in pairs),
        "lag_p99_delta_ms": statistics.median(w["client_lag_p99_ms"] - wo["client_lag_p99_ms"]
                                              for wo, w in pairs),
        "ttft_p99_delta_ms": statistics.median(w["ttft_p99_ms"] - wo["ttft_p99_ms"] for wo, w in pairs),
        "without_request_s": statistics.median(wo["request_s"] for wo, _ in pairs),
        "with_request_s": statistics.median(w["request_s"] for _, w in pairs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nvml", action="store_true", help="the real NVML library instead of the stand-in")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=8.0, help="(a): length of the idle and sampled windows")
    p.add_argument("--reps", type=int, default=5, help="(b): pairs without/with the sampler")
    p.add_argument("--h200-costs", action="store_true",
                   help="the stand-in spends each call's CPU time as measured on a real H200")
    p.add_argument("--json", type=Path, help="also write all results to this file")
    a = p.parse_args(argv)
    source = ("real NVML" if a.nvml
              else "pynvml stand-in (tests/fake_nvml.py), each call costing what it costs on an H200"
              if a.h200_costs else "pynvml stand-in (tests/fake_nvml.py): real NVML call cost NOT included")
    print(f"GPU sampler at {a.hz:g} Hz over {a.gpus} GPUs; reader on the {source}; "
          f"{os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        # the reference: the energy counter at every sample (before); then as the sampler reads it
        cpus_ = {label: cpu_cost(a, tmp, every) for label, every in (("energy every sample", 0.0),
                                                                      ("energy 1/s and at marks",
                                                                       ENERGY_EVERY_S))}
        for label, cpu in cpus_.items():
            print(f"(a) CPU, {label}: sampler thread {cpu['thread_cpu_s_per_min']:.3f} CPU-s per minute "
                  f"({cpu['thread_cpu_ms_per_sample']:.2f} ms per sample of {a.gpus} GPUs, "
                  f"{cpu['samples']} samples, {cpu['errors']} failed); "
                  f"process {cpu['process_cpu_s_per_min']:.3f} CPU-s/min against "
                  f"{cpu['idle_process_cpu_s_per_min']:.3f} idle: excess {cpu['excess_cpu_s_per_min']:.3f}",
                  flush=True)
        before, after = cpus_.values()
        print(f"(a) CPU per sample, 1/s against every sample: "
              f"{after['thread_cpu_ms_per_sample'] / before['thread_cpu_ms_per_sample']:.3f}", flush=True)
        cpu = after
        print(f"(b) load generator, closed loop c{CONCURRENCY}, {REQUESTS} x {OUTPUT_LEN}-token streams "
              "on the loopback server:", flush=True)
        load = loadgen_impact(a, tmp)
    print(f"(b) median over {a.reps} pairs: {load['without_request_s']:,.0f} req/s without, "
          f"{load['with_request_s']:,.0f} with; with/without {load['request_s_ratio']:.3f}; "
          f"loop lag p99 {load['lag_p99_delta_ms']:+.2f} ms, TTFT p99 {load['ttft_p99_delta_ms']:+.2f} ms")
    if a.json:
        with contextlib.suppress(OSError):
            a.json.write_bytes(orjson.dumps({"source": source, "cpu": list(cpus_.values()), "load": load},
                                            option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
