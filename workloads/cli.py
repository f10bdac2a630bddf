"""``python -m workloads``: one load point against any SGLang / OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import orjson

from vocab.load import APIS, SOURCES, TRACE_SOURCES, LoadPoint, RequestSpec, Source
from vocab.records import ERROR_KINDS, PointResult

from . import clock
from .argtypes import arrival_type, non_negative_float, non_negative_int, positive_float, positive_int
from .backend import ServerCheckError, normalize_url, probe_server, simulated_engine_clock
from .metrics import DEFAULT_LAG_THRESHOLD_MS, LATENCIES, SLO, STATS
from .runner import run_point
from .shard import run_sync
from .sources import as_sessions, source_requests, trace_point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads",
        description="Drive one load point (closed-loop concurrency or open-loop rate) against an SGLang "
        "or OpenAI-compatible server and report latency/throughput metrics.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--api",
        choices=APIS,
        default="generate",
        help="endpoint: /generate, /v1/completions or /v1/chat/completions (default: generate)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=positive_int,
                      help="closed loop: requests kept in flight (with --multi-turn: sessions)")
    mode.add_argument("--rate", type=positive_float,
                      help="open loop: requests per second (not with --arrival trace)")
    p.add_argument(
        "--requests",
        type=positive_int,
        help="measured requests (default 100; with --duration, an optional cap)",
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        help="seconds of measured sends instead of a request count (closed loop: then in-flight "
        "requests finish; open loop: every request scheduled in the window)",
    )
    p.add_argument("--input-len", type=positive_int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--output-len", type=positive_int, default=128, help="output tokens (default 128)")
    p.add_argument(
        "--input-dist",
        default="fixed",
        help="input length distribution around --input-len: fixed, uniform:R, normal:CV, exponential, "
        "lognormal:SIGMA (default fixed)",
    )
    p.add_argument("--output-dist", default="fixed", help="output length distribution (as --input-dist)")
    p.add_argument(
        "--prompt-file",
        help="JSONL prompts, one object a line: prompt|text (str), input_ids (ints) or messages; "
        "optional output_len",
    )
    p.add_argument("--shuffle-prompts", action="store_true", help="seeded shuffle of the prompt file rows")
    p.add_argument(
        "--continuous-usage",
        action="store_true",
        help="OpenAI APIs: ask for a running usage on every chunk (exact per-chunk token counts)",
    )
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=0,
        help="warmup requests sent first, excluded from metrics (default 0)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for prompts and arrivals (default 0)")
    p.add_argument(
        "--arrival",
        type=arrival_type,
        default="poisson",
        help="open-loop arrivals: poisson, gamma:CV (CV the gaps' coefficient of variation), constant, "
        "or trace (a --source trace's own timestamps) (default poisson)",
    )
    traffic = p.add_argument_group("real traffic (docs/workloads.md)")
    traffic.add_argument("--source", choices=SOURCES[1:],
                         help="requests from ShareGPT or a Mooncake / Azure trace instead of random ids")
    traffic.add_argument("--dataset-path", help="the source's file (default: the copy parasweep ships)")
    traffic.add_argument("--tokenizer", default="quicktok:llama3",
                         help="ShareGPT text to ids: quicktok:<encoding> or a tokenizer.json "
                         "(default quicktok:llama3)")
    traffic.add_argument("--context", type=positive_int,
                         help="the model's context: longer requests are skipped and counted")
    traffic.add_argument("--multi-turn", action="store_true",
                         help="ShareGPT: sessions of turns, each carrying the conversation so far")
    traffic.add_argument("--think-s", type=non_negative_float, default=0.0,
                         help="sessions: seconds between an answer and the next question (default 0)")
    traffic.add_argument("--trace-speed", type=positive_float, default=1.0,
                         help="--arrival trace: replay this many times faster (default 1)")
    traffic.add_argument("--trace-start", type=non_negative_float, default=0.0,
                         help="traces: replay from this many seconds after the first request")
    traffic.add_argument("--trace-window", type=positive_float, help="traces: replay this many seconds")
    traffic.add_argument("--block-size", type=positive_int, default=512,
                         help="Mooncake: prompt tokens per hash id (default 512)")
    p.add_argument("--max-concurrency", type=positive_int, help="open loop: cap on requests in flight")
    p.add_argument(
        "--ramp-s",
        type=non_negative_float,
        default=0.0,
        help="closed loop: the streams enter one by one over this many seconds, about one request's "
        "duration (default 0: all at once, a burst)",
    )
    p.add_argument(
        "--ci-target",
        type=positive_float,
        help="stop once the steady window's throughput is known to this fraction (95 %% interval, e.g. "
        "0.03); --requests and --duration are then upper bounds",
    )
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        default=32000,
        help="random token ids are drawn from [0, N) (default 32000)",
    )
    p.add_argument("--model", help="OpenAI 'model' field (default: ask GET /v1/models)")
    p.add_argument(
        "--read-timeout",
        type=positive_float,
        default=300.0,
        help="seconds without a byte before a request times out (default 300)",
    )
    p.add_argument(
        "--lag-threshold-ms",
        type=positive_float,
        default=DEFAULT_LAG_THRESHOLD_MS,
        help="client event-loop lag p99 above which the point is invalid (default 20)",
    )
    for bound in ("ttft", "tpot", "e2e"):
        p.add_argument(
            f"--slo-{bound}-ms", type=positive_float, help=f"goodput: {bound.upper()} bound per request (ms)"
        )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="load generator processes; the parent merges records and metrics (default 1)",
    )
    p.add_argument("--records", type=Path, help="append one JSON line per finished request to FILE.jsonl")
    p.add_argument("--json", action="store_true", help="print one JSON object of metrics instead of tables")
    return p


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    if v == int(v) and abs(v) < 1e12:
        return f"{int(v)}"
    return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def _print_tables(result: PointResult, url: str, spec: RequestSpec) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result.metrics
    console = Console()
    point = result.point
    console.print(
        f"[bold]{point.label}[/] {spec.api} against {url}: {m['completed']:.0f}/{m['num_requests']:.0f} "
        f"completed in {m['duration_s']:.2f} s; steady window {m['window_s']:.2f} s after a "
        f"{m['ramp_s']:.2f} s ramp, before a {m['drain_s']:.2f} s drain"
        + ("" if m.get("window_steady") == 1.0 else " (no steady state: the whole span instead)")
        + f": input {m['input_tokens']:.0f} / output {m['output_tokens']:.0f} tokens in it"
    )
    lat = Table(title="Latency (ms)")
    lat.add_column("metric")
    for s in STATS:
        lat.add_column(s, justify="right")
    for name in LATENCIES:
        lat.add_row(name, *(_fmt(m[f"{name}_{s}_ms"]) for s in STATS))
    console.print(lat)

    summary = Table(title="Throughput and load")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    keys = ["request_s", "output_tok_s", "output_tok_s_ci95", "input_tok_s", "total_tok_s"]
    keys += ["achieved_concurrency", "peak_concurrency"]
    keys += (
        ["offered_rate", "scheduled_rate", "achieved_rate", "schedule_lag_p99_ms"]
        if point.open_loop
        else ["offered_concurrency"]
    )
    keys += ["goodput_req_s", "goodput_tok_s", "slo_attainment"] if "slo_attainment" in m else []
    keys += ["client_lag_p99_ms", "client_lag_max_ms", "errors"]
    keys += [f"errors_{k}" for k in ERROR_KINDS if m.get(f"errors_{k}", 0) > 0]
    for k in keys:
        summary.add_row(k, _fmt(m[k]))
    console.print(summary)
    if result.invalid_reasons:
        console.print("[bold red]INVALID[/] (the client did not deliver the load it claims):")
        for reason in result.invalid_reasons:
            console.print(f"  - {reason}")
    else:
        console.print("[bold green]valid[/]: the client kept up with the requested load")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["calibrate"]:
        from .calibrate_cli import main as calibrate_main

        return calibrate_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    trace = args.arrival == "trace"
    if trace and (args.rate or args.concurrency or args.source not in TRACE_SOURCES):
        parser.error("--arrival trace replays a trace's timestamps: give --source mooncake or azure, "
                     "and no --rate or --concurrency")
    if not trace and args.rate is None and args.concurrency is None:
        parser.error("give --concurrency (closed loop) or --rate (open loop), or --arrival trace")
    try:
        source = None if args.source is None else Source(
            kind=args.source, path=args.dataset_path, tokenizer=args.tokenizer, multi_turn=args.multi_turn,
            think_s=args.think_s, context=args.context, start_s=args.trace_start,
            window_s=args.trace_window, block_size=args.block_size)
        spec = RequestSpec(
            api=args.api,
            input_len=args.input_len,
            output_len=args.output_len,
            seed=args.seed,
            vocab_size=args.vocab_size,
            model=args.model,
            continuous_usage=args.continuous_usage,
            input_dist=args.input_dist,
            output_dist=args.output_dist,
            prompt_file=args.prompt_file,
            shuffle_prompts=args.shuffle_prompts,
            source=source,
        )
        if source is not None:
            source_requests(spec)  # a missing or malformed file: one line now, not once per request
        point = trace_point(source_requests(spec).times_s, args.trace_speed, args.requests, args.warmup,
                            args.duration) if trace else LoadPoint(
            num_requests=args.requests if args.requests or args.duration else 100,
            concurrency=args.concurrency,
            rate=args.rate,
            arrival=args.arrival,
            max_concurrency=args.max_concurrency,
            warmup_requests=args.warmup,
            seed=args.seed,
            duration_s=args.duration,
            ramp_s=args.ramp_s,
            ci_target=args.ci_target,
        )
        point = as_sessions(point, spec)
        slo = None
        if args.slo_ttft_ms or args.slo_tpot_ms or args.slo_e2e_ms:
            slo = SLO(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, e2e_ms=args.slo_e2e_ms)
    except ValueError as e:
        parser.error(str(e))
    url = normalize_url(args.url)

    try:
        model = run_sync(probe_server(url))
        if spec.model is None and spec.api != "generate" and model is not None:
            spec = dataclasses.replace(spec, model=model)
        # a simulated engine played at --sim-time-scale F is timed on its own clock: its latencies and
        # rates, not the wall clock's (F times off)
        sim_clock = run_sync(simulated_engine_clock(url))
        if sim_clock is not None:
            print(f"note: a simulated engine at {sim_clock[0]:g}x real time: timed on its own clock "
                  "(every time and rate in its seconds)", file=sys.stderr)
        with clock.engine_clock(*sim_clock) if sim_clock is not None else nullcontext():
            result = run_point(
                url,
                point,
                spec,
                records_path=args.records,
                sock_read_timeout=args.read_timeout,
                read_timeout_setting="--read-timeout",
                lag_threshold_ms=args.lag_threshold_ms,
                slo=slo,
                workers=args.workers,
            )
    except ServerCheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # e.g. the records file cannot be written
        print(f"error: {e}", file=sys.stderr)
        return 1

    if args.json:
        out = {**result.metrics, "invalid_reasons": result.invalid_reasons}
        # orjson writes NaN as null: "no sample" stays distinguishable from 0.
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        _print_tables(result, url, spec)

    m = result.metrics
    if m["num_requests"] > 0 and m["completed"] == 0:
        first = next((r.error for r in result.records if r.error and not r.warmup), "unknown error")
        print(f"error: all {m['num_requests']:.0f} requests failed; first: {first}", file=sys.stderr)
        return 1
    return 0
