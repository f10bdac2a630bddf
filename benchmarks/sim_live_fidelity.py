"""Speed and live-mode fidelity of the simulated engine: emission timing, streamed throughput, and how
fast predictions run.

    .venv/bin/python benchmarks/sim_live_fidelity.py [--seconds 3] [--json out.json]

Three measurements, server pinned to CPU 0 and client to CPU 1 (``os.sched_setaffinity``):

1. Emission-time fidelity. One stream at ~1,000 tok/s (tiny-test model, ``--sim-time-scale`` chosen so
   one decode step lasts 1 ms of wall time). Every SSE chunk carries ``meta_info.sim_token_time`` (the
   simulated time the model emitted its latest token); ``/server_info`` gives ``sim_wall_origin``. The
   scheduled wall time of a chunk is ``origin + t / scale``; the deviation is the chunk's arrival at the
   client minus that. Goal: <= 2 ms.
2. Streamed throughput. 128 concurrent streams through ``workloads.run_point`` at model rates of 5k,
   10k and 20k tok/s. Reported: delivered tok/s, SSE events/s, the server's live lag. The
   reference is a minimal aiohttp SSE server of our own (no model: it writes one event per token as fast
   as it can) under the same client, pinning and payload shape. Goal: >= 5,000 tok/s on the schedule.
3. Prediction speed. CPU seconds to predict the 4-trial Kimi K2 PP8 demo sweep (async depth 0/1/2/4;
   concurrency 1, 8, 32; 256 in / 32 out; 8/16/64 requests + 2 warmup each) in virtual time, after
   the imports. Goal: well under a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "models" / "tiny-test")
BASE_ARGV = ["--model-path", TINY, "--sim-hardware", "h200-nvlink-x8", "--random-seed", "1"]
SERVER_CPU, CLIENT_CPU = 0, 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def _start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: _pin(SERVER_CPU),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(500):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"server did not start: {cmd}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


def _sim_step_s(argv: list[str], concurrency: int, out_len: int) -> float:
    """Simulated seconds per token of one stream (TPOT) at this concurrency, from the prediction API."""
    from simulator.predict import predict_point
    from workloads import LoadPoint, RequestSpec

    m = predict_point(
        argv,
        LoadPoint(num_requests=concurrency, concurrency=concurrency),
        RequestSpec(api="generate", input_len=16, output_len=out_len),
    ).metrics
    return m["tpot_p50_ms"] / 1e3


async def _stream_deviations(url: str, origin: float, scale: float, tokens: int) -> list[float]:
    import aiohttp

    body = {
        "input_ids": [1] * 16,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        "stream": True,
    }
    devs: list[float] = []
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as resp:
        buf = b""
        async for data in resp.content.iter_any():
            now = time.time()
            buf += data
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data: {"):
                    continue
                t = json.loads(ev[6:])["meta_info"].get("sim_token_time")
                if t is not None:
                    devs.append(now - (origin + t / scale))
    return devs


def emission_fidelity(seconds: float) -> dict:
    step = _sim_step_s(BASE_ARGV, 1, 64)
    scale = step / 1e-3  # one decode step = 1 ms of wall time -> ~1,000 tok/s
    proc, url = _start([sys.executable, "-m", "simulator", *BASE_ARGV, "--sim-time-scale", f"{scale:.6g}"])
    try:
        with urllib.request.urlopen(url + "/server_info") as r:
            origin = json.loads(r.read())["sim_wall_origin"]
        tokens = int(seconds * 1000)
        t0 = time.perf_counter()
        devs = asyncio.run(_stream_deviations(url, origin, scale, tokens))
        wall = time.perf_counter() - t0
    finally:
        _stop(proc)
    devs_ms = [d * 1e3 for d in devs[5:]]  # skip the first chunks (prefill, connection setup)
    return {
        "tokens": tokens,
        "chunks": len(devs),
        "tok_s": tokens / wall,
        "time_scale": scale,
        "dev_p50_ms": _pct(devs_ms, 0.5),
        "dev_p99_ms": _pct(devs_ms, 0.99),
        "dev_max_ms": max(devs_ms),
        "dev_min_ms": min(devs_ms),
    }


REFERENCE_SERVER = r"""
import asyncio, sys
import orjson
from aiohttp import web
async def generate(request):
    body = await request.json(loads=orjson.loads)
    n = body["sampling_params"]["max_new_tokens"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    ids = []
    for i in range(n):
        ids.append(i)
        await resp.write(b"data: " + orjson.dumps({"text": "x" * len(ids), "output_ids": ids,
            "meta_info": {"id": "r", "prompt_tokens": 16, "completion_tokens": len(ids),
                          "finish_reason": None, "sim_token_time": 0.0}}) + b"\n\n")
        await asyncio.sleep(0)
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def health(request):
    return web.Response(status=200)
app = web.Application()
app.router.add_post("/generate", generate)
app.router.add_get("/health", health)
import uvloop
web.run_app(app, host="127.0.0.1", port=int(sys.argv[-1]), print=None, access_log=None,
            loop=uvloop.new_event_loop())
"""


def _drive(url: str, concurrency: int, out_len: int, requests: int) -> dict:
    from workloads import LoadPoint, RequestSpec, run_point

    res = run_point(
        url,
        LoadPoint(num_requests=requests, concurrency=concurrency),
        RequestSpec(api="generate", input_len=16, output_len=out_len),
    )
    chunks = sum(len(r.chunk_times) for r in res.records)
    m = res.metrics
    return {
        "tok_s": m["output_tok_s"],
        "events_s": chunks / m["duration_s"],
        "valid": m["valid"],
        "client_lag_p99_ms": m["client_lag_p99_ms"],
    }


def throughput(seconds: float, concurrency: int = 128, out_len: int = 128) -> dict:
    out: dict = {"concurrency": concurrency, "output_len": out_len, "sim": []}
    step = _sim_step_s(BASE_ARGV, concurrency, out_len)  # simulated seconds per decode step at this batch
    for target in (5000, 10000, 20000):
        scale = target * step / concurrency  # wall step = step / scale -> concurrency/step*scale tok/s
        requests = max(2 * concurrency, int(target * seconds / out_len))
        proc, url = _start(
            [
                sys.executable,
                "-m",
                "simulator",
                *BASE_ARGV,
                "--sim-time-scale",
                f"{scale:.6g}",
                "--enable-metrics",
            ]
        )
        try:
            r = _drive(url, concurrency, out_len, requests)
            with urllib.request.urlopen(url + "/metrics") as resp:
                lag = [
                    ln for ln in resp.read().decode().splitlines() if ln.startswith("parasweep_sim:live_lag")
                ]
        finally:
            _stop(proc)
        r.update(
            target_tok_s=target, time_scale=scale, last_live_lag_s=float(lag[0].split()[-1]) if lag else None
        )
        out["sim"].append(r)
    port = _free_port()
    ref = subprocess.Popen(
        [sys.executable, "-c", REFERENCE_SERVER, str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: _pin(SERVER_CPU),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(500):
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.02)
        out["reference"] = _drive(
            url, concurrency, out_len, max(2 * concurrency, int(20000 * seconds / out_len))
        )
    finally:
        _stop(ref)
    return out


def prediction_speed() -> dict:
    from simulator.predict import predict_trial
    from workloads import LoadPoint, RequestSpec

    kimi_pp8 = ["--model-path", str(REPO / "models" / "kimi-k2"), "--pp-size", "8",
                "--sim-hardware", "rtx-pro-6000-pcie-x8"]
    spec = RequestSpec(api="generate", input_len=256, output_len=32)
    sizes = ((1, 8), (8, 16), (32, 64))  # (concurrency, measured requests)
    points = [LoadPoint(num_requests=n, concurrency=c, warmup_requests=2) for c, n in sizes]
    predict_trial(kimi_pp8, points[:1], spec)  # imports and first-use caches
    t0 = time.process_time()
    for depth in (0, 1, 2, 4):
        predict_trial([*kimi_pp8, "--pp-async-batch-depth", str(depth)], points, spec)
    return {"trials": 4, "points": 12, "cpu_s": time.process_time() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="approximate length of each measurement")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    _pin(CLIENT_CPU)
    py = platform.python_version()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {py}"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        machine = f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    except OSError:
        pass
    fid = emission_fidelity(args.seconds)
    print(f"machine: {machine}; server on CPU {SERVER_CPU}, client on CPU {CLIENT_CPU}")
    print(
        f"[1] emission fidelity, 1 stream at {fid['tok_s']:.0f} tok/s (scheduled 1000; ratio "
        f"{fid['tok_s'] / 1000:.3f}), {fid['chunks']} chunks: deviation from the model's schedule "
        f"p50 {fid['dev_p50_ms']:.2f} ms, p99 {fid['dev_p99_ms']:.2f} ms, max {fid['dev_max_ms']:.2f} ms "
        f"(min {fid['dev_min_ms']:.2f}); goal <= 2 ms"
    )
    tp = throughput(args.seconds)
    ref = tp["reference"]
    print(
        f"[2] streamed throughput, {tp['concurrency']} streams x {tp['output_len']} tokens; reference raw "
        f"aiohttp SSE server: {ref['tok_s']:.0f} tok/s ({ref['events_s']:.0f} events/s)"
    )
    for r in tp["sim"]:
        print(
            f"    model rate {r['target_tok_s']:>6} tok/s: delivered {r['tok_s']:7.0f} tok/s "
            f"(ratio to schedule {r['tok_s'] / r['target_tok_s']:.3f}, "
            f"to reference {r['tok_s'] / ref['tok_s']:.2f}), "
            f"{r['events_s']:7.0f} events/s, live lag {1e3 * (r['last_live_lag_s'] or 0):.1f} ms, "
            f"client lag p99 {r['client_lag_p99_ms']:.1f} ms, valid {r['valid']:.0f}"
        )
    speed = prediction_speed()
    print(f"[3] prediction speed: {speed['trials']} trials, {speed['points']} load points in "
          f"{speed['cpu_s']:.3f} s of CPU; goal well under 1 s")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "fidelity": fid, "throughput": tp,
                                         "prediction": speed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
