"""Command line: SGLang's launch flags (the subset parasweep uses) plus ``--sim-*`` flags; ``main()``."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable

from simulator.attention_dp.layout import DEEPEP_MODES, LOAD_BALANCE_METHODS
from simulator.model_spec import KV_CACHE_DTYPES, ONLINE_FP8
from vocab.model import DEFAULT_RESERVED_DECODE_TOKENS, DP_ROUTERS

_HRI = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?)?\s*$")
_HRI_MULT = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def human_readable_int(text: str) -> int:
    """SGLang 0.5.23's ``human_readable_int``: ``16384``, ``16k`` (x1000), ``16Ki`` (x1024), ``1M``..."""
    m = _HRI.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}")
    value = float(m.group(1)) * _HRI_MULT.get((m.group(2) or "").lower(), 1)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(value)


def _checked(text: str, parse: type[int] | type[float], ok: Callable[[float], bool], what: str) -> float:
    """``text`` parsed, or argparse's error naming what was expected (an unparseable value fails too)."""
    try:
        value = parse(text)
    except ValueError:
        value = math.nan
    if not ok(value):  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A share of requests: a number in [0, 1]."""
    return _checked(text, float, lambda v: 0.0 <= v <= 1.0, "a fraction in [0, 1]")


def count(text: str) -> int:
    """A request number: an integer >= 1."""
    return int(_checked(text, int, lambda v: v >= 1, "an integer >= 1"))


def seconds(text: str) -> float:
    """A duration: a finite number of seconds >= 0."""
    return _checked(text, float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")


def _add_fault_flags(p: argparse.ArgumentParser) -> None:
    """Faults injected on purpose (simulator/faults.py; docs/simulator.md, "Fault injection"). Never
    passed to real SGLang. Fractions are drawn per request from --random-seed and the request's arrival
    number, so the same seed and request order meet the same faults."""
    g = p.add_argument_group("fault injection (simulated engine only)")
    a = g.add_argument
    a("--sim-fault-crash-after-requests", type=count, default=None, metavar="N",
      help="when the N-th generation request arrives, log a scheduler crash and die at once "
           "(SIGKILL, as SGLang's launcher kills its tree): every open connection drops")
    a("--sim-fault-hang-before-ready", action="store_true",
      help="bind the port but never become ready: /health and /health_generate answer 503 forever; "
           "SIGTERM still stops the process")
    a("--sim-fault-startup-delay-s", type=seconds, default=0.0, metavar="S",
      help="/health answers 503 until S wall seconds after start-up (startup_time in /server_info), "
           "then as usual")
    a("--sim-fault-hang-after-requests", type=count, default=None, metavar="N",
      help="from the N-th generation request on, the engine produces no token for anyone (a deadlocked "
           "scheduler); the process stays up and open streams stay open and silent. /health and "
           "/health_generate then behave as SGLang's with a stuck scheduler: the probe generation gets "
           "no output, so each answers 503 only after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) and logs "
           "'Health check failed'")
    a("--sim-fault-stall-stream-fraction", type=fraction, default=0.0, metavar="F",
      help="this fraction of streams sends its first tokens, then goes silent with the connection open")
    a("--sim-fault-http-error-fraction", type=fraction, default=0.0, metavar="F",
      help="this fraction of generation requests is answered HTTP 500 with SGLang's JSON error body")
    a("--sim-fault-malformed-sse-fraction", type=fraction, default=0.0, metavar="F",
      help="this fraction of streams carries one unparseable SSE event after its first tokens")
    a("--sim-fault-cut-stream-fraction", type=fraction, default=0.0, metavar="F",
      help="this fraction of streams has its TCP connection closed after its first tokens (no final "
           "chunk, no [DONE])")
    a("--sim-fault-oom-at-start", action="store_true",
      help="start-up fails: log a CUDA out-of-memory traceback as SGLang does and exit with code 1")


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The simulator's own flags (``--sim-*``: hardware, calibration, pace, faults), whichever engine's
    flags it is playing."""
    a = p.add_argument
    a("--sim-hardware", required=True, metavar="NAME_OR_PATH",
      help="hardware profile: a name under conf/hardware/ or a path to a .yaml/.json file")
    a("--sim-calibration", default=None, metavar="PATH",
      help="calibration profile (YAML) with fitted cost-model constants (python -m orchestrator calibrate)")
    a("--sim-step-costs", default="auto", choices=["auto", "roofline", "measured"],
      help="what prices each step's kernels: measured kernel tables (aiconfigurator-core) for the hardware "
           "profile's GPU, the roofline, or auto (measured where covered)")
    a("--sim-router", default="round_robin", choices=list(DP_ROUTERS),
      help="with --dp-size > 1: how requests are spread over the replicas: SGLang's DP controller "
           "(round_robin), or the sglang-router package's cache_aware policy in front of them")
    a("--sim-spec-acceptance", default="auto:chat", metavar="ACCEPTANCE",
      help="with speculative decoding: how many drafted tokens the target accepts. auto:chat|code|math (the "
           "published accept lengths of the draft kind), a mean accept length, or rates:p1,p2,... (each "
           "draft position's acceptance given the one before); SGLANG_SIMULATE_ACC_LEN wins where set")
    a("--sim-pd-node", type=int, default=0, metavar="N",
      help="with --disaggregation-mode: the node of the deployment this server sits on (a prefill server "
           "sends its KV over the GPUs' link to decode servers on its node, over the network to others)")
    a("--sim-time-scale", type=float, default=1.0, metavar="F",
      help="simulated seconds per wall-clock second (2.0 runs twice as fast)")
    _add_fault_flags(p)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a misspelt or abbreviated flag must fail loudly instead of silently matching.
    p = argparse.ArgumentParser(
        prog="python -m simulator",
        description="parasweep simulated engine: SGLang-compatible server with discrete-event timing.",
        allow_abbrev=False,
    )
    a = p.add_argument
    # model / tokenizer
    a("--model-path", "--model", dest="model_path", required=True, help="directory with config.json")
    a("--served-model-name", default=None)
    a("--tokenizer-path", default=None)
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", default="auto")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=human_readable_int, default=None)
    a("--dtype", default="auto")
    a("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES))
    # SGLang's --quantization: "fp8" quantizes an unquantized checkpoint's linear layers at load time
    # (a checkpoint already in FP8 is unchanged); the other methods are not modelled
    a("--quantization", default=None, choices=[ONLINE_FP8])
    # parallelism
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    # across nodes: SGLang starts one process per node; the simulated engine's rank 0 stands for all
    a("--nnodes", dest="nnodes", type=int, default=1)
    a("--node-rank", dest="node_rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    a("--dist-timeout", dest="dist_timeout", type=int, default=None)
    a("--pp-async-batch-depth", type=int, default=0)
    a("--pp-max-micro-batch-size", type=int, default=None)
    a("--moe-a2a-backend", default="none")
    # attention data parallelism (simulator/attention_dp/); --enable-dp-attention is 0.5.23's deprecated
    # spelling: with it, --dp-size counts attention-DP ranks
    a("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    a("--enable-dp-attention", action="store_true")
    a("--load-balance-method", default="auto", choices=list(LOAD_BALANCE_METHODS))
    a("--deepep-mode", default="auto", choices=list(DEEPEP_MODES))
    a("--enable-eplb", action="store_true")
    a("--ep-num-redundant-experts", type=int, default=0)
    a("--enable-dp-lm-head", action="store_true")
    a("--moe-dense-tp-size", type=int, default=None)
    a("--enable-two-batch-overlap", action="store_true")
    a("--disable-shared-experts-fusion", action="store_true")
    # capacity / scheduling
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=human_readable_int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=human_readable_int, default=16384)
    a("--schedule-policy", default="fcfs")
    a("--disable-overlap-schedule", action="store_true")
    a("--mem-fraction-static", type=float, default=None)
    a("--page-size", type=int, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    # speculative decoding (simulator/speculative/)
    a("--speculative-algorithm", default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
      default=None)
    a("--speculative-draft-load-format", default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    # prefill/decode disaggregation (simulator/disagg/)
    a("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    a("--disaggregation-transfer-backend", default="mooncake",
      choices=["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"])
    a("--disaggregation-bootstrap-port", type=int, default=8998)
    a("--num-reserved-decode-tokens", type=int, default=DEFAULT_RESERVED_DECODE_TOKENS)
    a("--disaggregation-decode-polling-interval", type=int, default=1)
    # CUDA graphs / kernels
    a("--disable-cuda-graph", action="store_true")
    # SGLang spells it --cuda-graph-max-bs before 0.5.14 (and accepts that spelling until 0.5.20)
    a("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int,
      default=None)
    a("--attention-backend", default=None)
    # network / observability
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--enable-metrics", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    a("--random-seed", type=int, default=None)
    a("--stream-interval", type=int, default=1)
    # the scheduler takes new requests from its socket only every N decode iterations (simulator/replica.py)
    a("--scheduler-recv-interval", type=int, default=1)
    a("--skip-server-warmup", action="store_true")
    a("--watchdog-timeout", type=float, default=300.0)
    add_sim_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on unknown flags, as SGLang does
    # Imports after parsing keep `--help` and flag errors instant.
    from simulator.resolve import FlagError, resolve

    rank = args.node_rank
    args.node_rank = 0  # a follower checks the same flags as rank 0 would
    try:
        cfg = resolve(args)
    except FlagError as e:
        print(f"ValueError: {e}", file=sys.stderr, flush=True)
        return 1
    if rank > 0:  # joins rank 0 and stands by: rank 0 models every node (simulator/nodes.py)
        from simulator.nodes import follow

        return follow(args.dist_init_addr, rank, args.nnodes, args.dist_timeout)
    from simulator.server import serve

    return serve(cfg)
