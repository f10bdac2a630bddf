"""``python -m workloads calibrate [...]``: the client's own ceiling (see :mod:`workloads.calibrate`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import orjson

from .argtypes import positive_float_list, positive_int_list


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads calibrate",
        description="Measure this client's ceiling (concurrent streams, tokens/s, requests/s) against a "
        "built-in no-op streaming server started in its own process.",
    )
    p.add_argument(
        "--concurrency-levels",
        type=positive_int_list,
        default=[64, 128, 256, 512, 1024, 2048],
        help="closed-loop ladder (default 64,128,256,512,1024,2048)",
    )
    p.add_argument(
        "--rates",
        type=positive_float_list,
        default=[250, 500, 1000, 2000, 4000],
        help="open-loop ladder in req/s (default 250,500,1000,2000,4000; empty string: skip)",
    )
    p.add_argument("--output-len", type=int, default=100, help="tokens per stream (default 100)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="server time between tokens (default 10)")
    p.add_argument("--ttft-ms", type=float, default=10.0, help="server time to first token (default 10)")
    p.add_argument("--api", choices=("generate", "completions", "chat"), default="generate")
    p.add_argument("--workers", type=int, default=1, help="load generator processes (default 1)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the server and client to separate CPUs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from .calibrate import calibrate

    args = build_parser().parse_args(argv)

    def show(step: object) -> None:
        if args.json:
            return
        s = step.__dict__
        what = f"c{s['target']:g}" if s["kind"] == "streams" else f"r{s['target']:g}"
        verdict = "pass" if s["passed"] else "FAIL: " + "; ".join(s["reasons"])
        print(
            f"{what:>7}  {s['output_tok_s']:9.0f} tok/s  achieved {s['achieved']:8.1f}  "
            f"TTFT p99 +{s['client_overhead_ttft_p99_ms']:6.1f} ms  "
            f"loop lag p99 {s['client_lag_p99_ms']:5.1f} ms  "
            f"{verdict}",
            flush=True,
        )

    try:
        out = calibrate(
            concurrency_levels=args.concurrency_levels,
            rates=args.rates,
            output_len=args.output_len,
            itl_ms=args.itl_ms,
            ttft_ms=args.ttft_ms,
            api=args.api,
            workers=args.workers,
            pin=not args.no_pin,
            on_step=show,
        )
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        print(
            f"ceiling: {out['max_streams']:g} concurrent streams ({out['max_output_tok_s']:.0f} tok/s), "
            f"{out['max_rate']:g} req/s open loop; workers={out['workers']}, "
            f"server CPUs {out['server_cpus']}, client CPUs {out['client_cpus']}"
        )
    return 0
