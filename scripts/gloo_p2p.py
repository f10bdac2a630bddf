#!/usr/bin/env python3
"""Measure gloo point-to-point costs of SGLang's pipeline-parallel host relays.

SGLang's PP scheduler (``event_loop_pp``) moves Python objects between
adjacent stages over a *gloo* CPU process group in two ways:

* ``point_to_point_pyobj`` (sglang/srt/utils/common.py) relays the list of
  received requests: an 8-byte int64 size tensor, then a uint8 tensor holding
  ``pickle.dumps(list)``. An empty list sends only the size tensor (value 0).
  The receiver posts ``irecv`` + ``wait()`` for the size, then for the payload,
  and unpickles.
* ``GroupCoordinator.send_object`` / ``recv_object``
  (sglang/srt/distributed/parallel_state.py) carry the *metadata* of every
  PP tensor dict (proxy hidden states, sampled-token outputs): the same
  size + pickled-payload pair of gloo messages, before the tensors
  themselves go over NCCL.

This script starts two processes on 127.0.0.1 that use torch.distributed with
the gloo backend and measures, after warm-up, medians and p90s of:

(a) one-way latency of the ``point_to_point_pyobj`` pattern for an empty list
    and for pickled payloads of roughly 200 B, 2 KB and 20 KB (ping-pong,
    round trip halved; the clock runs from the sender's first send call to
    the receiver holding the unpickled object);
(b) one-way latency of ``send_object``/``recv_object`` for PP tensor-dict
    metadata lists (output dict and proxy dict);
(c) host-side costs: the sender's time to return from the async ``isend``
    calls (with and without pickling/tensor construction), the ``wait()`` on
    already finished send work, the receiver's time to take a message that has
    already arrived, and ``pickle.dumps`` / ``pickle.loads`` of each object.

The result is printed as one JSON object and optionally written to a file.
It does not depend on SGLang; the message patterns are re-implemented here.

Example::

    python gloo_p2p.py --reps 2000 --warmup 200 --out gloo_p2p.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with most torch installs
    np = None

# Same shape as sglang.srt.distributed.parallel_state.TensorMetadata.
TensorMetadata = namedtuple("TensorMetadata", ["device", "dtype", "size"])

SRC, DST = 0, 1


# ---------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------


def _request_like_list(target_bytes: int) -> list[Any]:
    """A list of request-like records whose pickle is about target_bytes long.

    Built from builtins only so both processes can unpickle it. Each record
    mimics a tokenized request: an id, token ids and sampling parameters.
    """
    if target_bytes <= 0:
        return []

    def make(num_tokens: int) -> list[Any]:
        return [
            {
                "rid": "0123456789abcdef0123456789abcdef",
                "input_ids": list(range(1000, 1000 + num_tokens)),
                "sampling_params": {
                    "temperature": 0.0,
                    "max_new_tokens": 128,
                    "stop": None,
                },
                "stream": True,
            }
        ]

    lo, hi = 0, max(16, target_bytes)
    while lo < hi:  # smallest token count reaching the target size
        mid = (lo + hi) // 2
        if len(pickle.dumps(make(mid))) < target_bytes:
            lo = mid + 1
        else:
            hi = mid
    return make(lo)


def _output_metadata(batch_size: int) -> list[tuple[str, Any]]:
    """Metadata list that send_tensor_dict pickles for a PP 'output' dict."""
    return [
        (
            "next_token_ids",
            TensorMetadata("cuda", torch.int64, torch.Size([batch_size])),
        ),
        ("__msg_type__", "output"),
    ]


def _proxy_metadata(num_tokens: int, hidden: int) -> list[tuple[str, Any]]:
    """Metadata list that send_tensor_dict pickles for a PP 'proxy' dict."""
    return [
        (
            "hidden_states",
            TensorMetadata("cuda", torch.bfloat16, torch.Size([num_tokens, hidden])),
        ),
        (
            "residual",
            TensorMetadata("cuda", torch.bfloat16, torch.Size([num_tokens, hidden])),
        ),
        ("__msg_type__", "proxy"),
    ]


def build_payloads(sizes: list[int]) -> dict[str, Any]:
    payloads: dict[str, Any] = {"pyobj_empty": []}
    for size in sizes:
        payloads[f"pyobj_{size}B"] = _request_like_list(size)
    return payloads


def build_metadata_objects(batch_size: int, hidden: int) -> dict[str, Any]:
    return {
        "meta_output": _output_metadata(batch_size),
        "meta_proxy": _proxy_metadata(batch_size, hidden),
    }


# ---------------------------------------------------------------------------
# The two SGLang message patterns
# ---------------------------------------------------------------------------


def _bytes_to_uint8(data: bytes) -> torch.Tensor:
    if np is not None:  # what point_to_point_pyobj does
        return torch.ByteTensor(np.frombuffer(data, dtype=np.uint8))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _uint8_to_bytes(tensor: torch.Tensor) -> bytes:
    if np is not None:
        return bytes(tensor.numpy())
    return bytes(tensor.tolist())


def pyobj_send(data: list[Any], dst: int, async_send: bool) -> list[Any]:
    """point_to_point_pyobj, sender side. Returns (work, tensor) pairs."""
    send = dist.isend if async_send else dist.send
    works: list[Any] = []
    if len(data) == 0:
        size = torch.tensor([0], dtype=torch.long)
        works.append((send(size, dst), size))
        return works
    serialized = pickle.dumps(data)
    payload = _bytes_to_uint8(serialized)
    size = torch.tensor([len(serialized)], dtype=torch.long)
    works.append((send(size, dst), size))
    works.append((send(payload, dst), payload))
    return works


def pyobj_recv(src: int) -> list[Any]:
    """point_to_point_pyobj, receiver side (irecv + wait, twice)."""
    size = torch.tensor([0], dtype=torch.long)
    dist.irecv(size, src=src).wait()
    n = size.item()
    if n == 0:
        return []
    payload = torch.empty(n, dtype=torch.uint8)
    dist.irecv(payload, src=src).wait()
    return pickle.loads(_uint8_to_bytes(payload))


def object_send(obj: Any, dst: int, async_send: bool) -> list[Any]:
    """GroupCoordinator.send_object: pickle, size message, payload message."""
    send = dist.isend if async_send else dist.send
    payload = torch.frombuffer(pickle.dumps(obj), dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.long, device="cpu")
    works: list[Any] = [(send(size, dst), size)]
    works.append((send(payload, dst), payload))
    return works


def object_recv(src: int) -> Any:
    """GroupCoordinator.recv_object."""
    size = torch.empty(1, dtype=torch.long, device="cpu")
    dist.irecv(size, src=src).wait()
    payload = torch.empty(size.item(), dtype=torch.uint8, device="cpu")
    dist.irecv(payload, src=src).wait()
    if np is not None:
        return pickle.loads(payload.numpy())
    return pickle.loads(_uint8_to_bytes(payload))


PATTERNS: dict[str, tuple[Callable[..., list[Any]], Callable[[int], Any]]] = {
    "pyobj": (pyobj_send, pyobj_recv),
    "object": (object_send, object_recv),
}


def _wait_all(works: list[Any]) -> None:
    for work, _tensor in works:
        if work is not None:
            work.wait()


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def summarize(samples_ns: list[int]) -> dict[str, float]:
    """Median, p90 and friends in microseconds."""
    us = sorted(s / 1e3 for s in samples_ns)
    n = len(us)

    def pct(p: float) -> float:
        return us[min(n - 1, max(0, round(p * (n - 1))))]

    return {
        "n": n,
        "median_us": round(statistics.median(us), 3),
        "p10_us": round(pct(0.10), 3),
        "p90_us": round(pct(0.90), 3),
        "p99_us": round(pct(0.99), 3),
        "mean_us": round(statistics.fmean(us), 3),
        "min_us": round(us[0], 3),
    }


def _half(samples_ns: list[int]) -> list[int]:
    return [s // 2 for s in samples_ns]


# ---------------------------------------------------------------------------
# Benchmarks run inside the two processes
# ---------------------------------------------------------------------------


def bench_pingpong(
    rank: int, kind: str, obj: Any, reps: int, warmup: int, async_send: bool
) -> list[int] | None:
    """Round trips of `obj` with the given pattern; rank 0 returns RTTs (ns).

    Both directions use the same pattern, so one way = RTT / 2. Like
    event_loop_pp, sends are async and their work is waited on only before
    the next send (the previous send has long finished by then).
    """
    send_fn, recv_fn = PATTERNS[kind]
    peer = DST if rank == SRC else SRC
    rtts: list[int] = []
    pending: list[Any] = []
    for i in range(warmup + reps):
        if rank == SRC:
            _wait_all(pending)
            t0 = time.perf_counter_ns()
            pending = send_fn(obj, peer, async_send)
            got = recv_fn(peer)
            t1 = time.perf_counter_ns()
            if i >= warmup:
                rtts.append(t1 - t0)
        else:
            got = recv_fn(peer)
            _wait_all(pending)
            pending = send_fn(got, peer, async_send)
    _wait_all(pending)
    return rtts if rank == SRC else None


def bench_send_host_cost(
    rank: int, kind: str, obj: Any, reps: int, warmup: int, gap_s: float
) -> dict[str, list[int]] | None:
    """Sender-side host cost of the async send and of its later wait().

    Rank 0 times the full send call (pickle + tensors + isend calls), then,
    after the peer has received the message and acknowledged it with a
    one-element tensor, times wait() on the finished works. `gap_s` of
    sleep before each send lets both processes go idle first, which is what
    a scheduler sees between relays.
    """
    send_fn, recv_fn = PATTERNS[kind]
    ack = torch.zeros(1, dtype=torch.long)
    send_ns: list[int] = []
    wait_ns: list[int] = []
    for i in range(warmup + reps):
        if rank == SRC:
            if gap_s:
                time.sleep(gap_s)
            t0 = time.perf_counter_ns()
            works = send_fn(obj, DST, True)
            t1 = time.perf_counter_ns()
            dist.recv(ack, src=DST)
            t2 = time.perf_counter_ns()
            _wait_all(works)
            t3 = time.perf_counter_ns()
            if i >= warmup:
                send_ns.append(t1 - t0)
                wait_ns.append(t3 - t2)
        else:
            recv_fn(SRC)
            dist.send(ack, dst=SRC)
    return {"send_call": send_ns, "wait_finished": wait_ns} if rank == SRC else None


def bench_isend_only(
    rank: int, nbytes: int, reps: int, warmup: int, gap_s: float
) -> list[int] | None:
    """Time of the two bare isend calls (size + payload), tensors prebuilt."""
    size = torch.tensor([nbytes], dtype=torch.long)
    payload = torch.zeros(max(nbytes, 1), dtype=torch.uint8)
    ack = torch.zeros(1, dtype=torch.long)
    out: list[int] = []
    for i in range(warmup + reps):
        if rank == SRC:
            if gap_s:
                time.sleep(gap_s)
            t0 = time.perf_counter_ns()
            w1 = dist.isend(size, DST)
            w2 = dist.isend(payload, DST) if nbytes else None
            t1 = time.perf_counter_ns()
            dist.recv(ack, src=DST)
            w1.wait()
            if w2 is not None:
                w2.wait()
            if i >= warmup:
                out.append(t1 - t0)
        else:
            dist.recv(size, src=SRC)
            if nbytes:
                buf = torch.empty(size.item(), dtype=torch.uint8)
                dist.recv(buf, src=SRC)
            dist.send(ack, dst=SRC)
    return out if rank == SRC else None


def bench_recv_arrived(
    rank: int, kind: str, obj: Any, reps: int, warmup: int, gap_s: float
) -> list[int] | None:
    """Receiver host cost when the message is already in the socket.

    Rank 0 sends, rank 1 sleeps `gap_s` (so the bytes have arrived) and then
    times the full receive (irecv/wait twice + unpickle). Returned by rank 1.
    """
    send_fn, recv_fn = PATTERNS[kind]
    ack = torch.zeros(1, dtype=torch.long)
    out: list[int] = []
    for i in range(warmup + reps):
        if rank == SRC:
            works = send_fn(obj, DST, True)
            dist.recv(ack, src=DST)
            _wait_all(works)
        else:
            time.sleep(gap_s)
            t0 = time.perf_counter_ns()
            recv_fn(SRC)
            t1 = time.perf_counter_ns()
            dist.send(ack, dst=SRC)
            if i >= warmup:
                out.append(t1 - t0)
    return out if rank == DST else None


def bench_send_vs_late_recv(
    rank: int, kind: str, obj: Any, reps: int, warmup: int, delay_s: float
) -> list[int] | None:
    """Does an async send complete before the peer posts its receive?

    Rank 1 signals rank 0, then sleeps `delay_s` before receiving. Rank 0
    sends right after the signal and times send call + wait() on the works.
    A result near `delay_s` means gloo's send waits for the matching receive
    (rendezvous); a result near the bare send cost means it completes eagerly.
    In event_loop_pp this decides whether _pp_commit_comm_work(send_req_work)
    can stall a stage on its successor's progress.
    """
    send_fn, recv_fn = PATTERNS[kind]
    go = torch.zeros(1, dtype=torch.long)
    out: list[int] = []
    for i in range(warmup + reps):
        if rank == SRC:
            dist.recv(go, src=DST)
            t0 = time.perf_counter_ns()
            _wait_all(send_fn(obj, DST, True))
            t1 = time.perf_counter_ns()
            if i >= warmup:
                out.append(t1 - t0)
        else:
            dist.send(go, dst=SRC)
            time.sleep(delay_s)
            recv_fn(SRC)
    return out if rank == SRC else None


def bench_pickle(obj: Any, reps: int, warmup: int) -> dict[str, Any]:
    """pickle.dumps / pickle.loads of obj (default protocol, as SGLang)."""
    data = pickle.dumps(obj)
    dumps_ns: list[int] = []
    loads_ns: list[int] = []
    for i in range(warmup + reps):
        t0 = time.perf_counter_ns()
        pickle.dumps(obj)
        t1 = time.perf_counter_ns()
        pickle.loads(data)
        t2 = time.perf_counter_ns()
        if i >= warmup:
            dumps_ns.append(t1 - t0)
            loads_ns.append(t2 - t1)
    return {
        "pickled_bytes": len(data),
        "dumps": summarize(dumps_ns),
        "loads": summarize(loads_ns),
    }


def _worker(rank: int, args: argparse.Namespace, queue: Any) -> None:
    # SGLang builds the same non-writable views; the warning is noise here.
    warnings.filterwarnings("ignore", message=".*not writable.*")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if args.pin and len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[rank]})
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=2,
    )
    torch.set_num_threads(1)
    payloads = build_payloads(args.sizes)
    metas = build_metadata_objects(args.meta_batch_size, args.meta_hidden)
    cases: list[tuple[str, str, Any]] = [
        ("pyobj", name, obj) for name, obj in payloads.items()
    ] + [("object", name, obj) for name, obj in metas.items()]
    gap = args.gap_us / 1e6
    result: dict[str, Any] = {"one_way": {}, "sender_host": {}, "receiver_host": {}}

    for kind, name, obj in cases:
        dist.barrier()
        rtts = bench_pingpong(rank, kind, obj, args.reps, args.warmup, True)
        if rtts is not None:
            result["one_way"][name] = {
                "pattern": kind,
                "pickled_bytes": len(pickle.dumps(obj)) if obj else 0,
                "gloo_messages": 1 if (kind == "pyobj" and not obj) else 2,
                "one_way": summarize(_half(rtts)),
                "round_trip": summarize(rtts),
            }
    for kind, name, obj in cases:
        dist.barrier()
        res = bench_send_host_cost(rank, kind, obj, args.reps, args.warmup, gap)
        if res is not None:
            result["sender_host"][name] = {
                "send_call_incl_pickle": summarize(res["send_call"]),
                "wait_on_finished_send": summarize(res["wait_finished"]),
            }
    for nbytes in [0, *args.sizes]:
        dist.barrier()
        res_i = bench_isend_only(rank, nbytes, args.reps, args.warmup, gap)
        if res_i is not None:
            result["sender_host"][f"bare_isend_{nbytes}B"] = summarize(res_i)
    for kind, name, obj in cases:
        dist.barrier()
        res_r = bench_recv_arrived(rank, kind, obj, args.reps, args.warmup, gap)
        if res_r is not None:
            result["receiver_host"][name] = summarize(res_r)
    result["send_completion_vs_late_recv"] = {"recv_delay_us": args.late_recv_us}
    late_reps = max(50, args.reps // 10)
    for kind, name, obj in cases:
        dist.barrier()
        res_l = bench_send_vs_late_recv(
            rank, kind, obj, late_reps, 10, args.late_recv_us / 1e6
        )
        if res_l is not None:
            result["send_completion_vs_late_recv"][name] = summarize(res_l)
    dist.barrier()
    if rank == SRC:
        result["pickle"] = {
            name: bench_pickle(obj, args.reps, args.warmup) for _k, name, obj in cases
        }
    queue.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# Environment and main
# ---------------------------------------------------------------------------


def _cpu_model() -> dict[str, Any]:
    info: dict[str, Any] = {"logical_cpus": os.cpu_count()}
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=True
        ).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("Model name", "Vendor ID", "CPU family", "Model",
                       "Hypervisor vendor", "Thread(s) per core",
                       "Core(s) per socket", "Socket(s)", "CPU max MHz"):
                info[key] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        info["Model name"] = platform.processor() or "unknown"
    return info


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2000,
                   help="measured repetitions per case (default 2000)")
    p.add_argument("--warmup", type=int, default=200,
                   help="warm-up repetitions per case (default 200)")
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 2000, 20000],
                   help="target pickled sizes in bytes of the request-like "
                        "lists (default 200 2000 20000)")
    p.add_argument("--meta-batch-size", type=int, default=64,
                   help="batch size written into the metadata objects")
    p.add_argument("--meta-hidden", type=int, default=8192,
                   help="hidden size written into the proxy metadata object")
    p.add_argument("--gap-us", type=float, default=200.0,
                   help="idle sleep before each timed host-cost call (us)")
    p.add_argument("--late-recv-us", type=float, default=2000.0,
                   help="receiver delay for the send-completion test (us)")
    p.add_argument("--pin", action="store_true",
                   help="pin the two ranks to two different CPUs")
    p.add_argument("--port", type=int, default=0,
                   help="TCP port for the rendezvous (0 = pick a free one)")
    p.add_argument("--out", type=str, default=None,
                   help="also write the JSON result to this path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.port == 0:
        args.port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    t0 = time.time()
    mp.spawn(_worker, args=(args, queue), nprocs=2, join=True)
    per_rank: dict[int, dict[str, Any]] = {}
    while not queue.empty():
        rank, res = queue.get()
        per_rank[rank] = res
    merged = per_rank[SRC]
    merged["receiver_host"] = per_rank[DST]["receiver_host"]
    result: dict[str, Any] = {
        "description": (
            "gloo point-to-point costs of SGLang PP host relays on 127.0.0.1; "
            "times in microseconds; one_way = ping-pong round trip / 2"
        ),
        "environment": {
            "cpu": _cpu_model(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "numpy": None if np is None else np.__version__,
        },
        "config": {
            "reps": args.reps,
            "warmup": args.warmup,
            "sizes": args.sizes,
            "meta_batch_size": args.meta_batch_size,
            "meta_hidden": args.meta_hidden,
            "gap_us": args.gap_us,
            "late_recv_us": args.late_recv_us,
            "pin": args.pin,
            "async_send": True,
        },
        "notes": {
            "one_way": "sender's first isend call to receiver holding the "
                       "unpickled object (includes pickle, tensor build, 1-2 "
                       "gloo messages, unpickle)",
            "sender_host.send_call_incl_pickle": "time to return from the "
                       "pattern's send side with async_send=True",
            "sender_host.wait_on_finished_send": "work.wait() on sends that "
                       "the receiver has already acknowledged",
            "sender_host.bare_isend_*": "only the isend calls, tensors prebuilt",
            "receiver_host": "full receive when the message has already "
                             "arrived (receiver slept gap_us first)",
            "send_completion_vs_late_recv": "send call + wait() when the "
                             "receiver posts its recv late_recv_us after the "
                             "sender starts; ~late_recv_us => rendezvous",
        },
        "wall_s": round(time.time() - t0, 1),
        **merged,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
