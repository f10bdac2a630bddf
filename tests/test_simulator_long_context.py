"""The simulated engine's long-prompt behaviour, in virtual time through the public prediction API:
the KV pool's dtype, SGLang's admission with decode-token reservation, mixed prefill/decode batches,
and each request's queue time."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from simulator.logs import LogWriter, startup_lines
from simulator.predict import load_config, predict_point
from workloads import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent
LLAMA70 = ["--model-path", str(REPO / "models" / "llama-3.1-70b"), "--tp-size", "4",
           "--sim-hardware", "h100-sxm-x8"]
LLAMA8 = ["--model-path", str(REPO / "models" / "llama-3.1-8b"), "--sim-hardware", "h100-sxm-x8"]
LONG = RequestSpec(api="generate", input_len=2048, output_len=256)


def test_an_fp8_kv_cache_holds_twice_the_tokens_and_says_so() -> None:
    bf16 = load_config([*LLAMA70, "--mem-fraction-static", "0.42"])
    fp8 = load_config([*LLAMA70, "--mem-fraction-static", "0.42", "--kv-cache-dtype", "fp8_e4m3"])
    assert fp8.max_total_num_tokens == pytest.approx(2 * bf16.max_total_num_tokens, rel=1e-3)
    out = io.StringIO()
    startup_lines(fp8, LogWriter(stream=out))
    assert "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens:" in out.getvalue()
    assert fp8.server_info()["kv_cache_dtype"] == "fp8_e4m3"


def test_admission_reserves_every_decode_token_so_the_pool_runs_few_and_the_rest_wait() -> None:
    argv = [*LLAMA70, "--mem-fraction-static", "0.42"]
    cfg = load_config(argv)
    fits = cfg.max_total_num_tokens // (2048 + 256)  # prompt + every token it may still produce
    m = predict_point(argv, LoadPoint(concurrency=16, num_requests=32, warmup_requests=0), LONG).metrics
    assert m["sim_peak_running_reqs"] == fits == 3
    # the pool is never full by its used share, yet nobody else gets in: what waits is the reservation
    assert m["kv_token_usage_max"] < 0.95
    # the TTFT is the wait: the model's own queue time per request (admission - arrival)
    assert m["ttft_p99_queue_ms"] > 0.9 * m["ttft_p99_ms"] and m["ttft_queue_share"] > 0.9


def test_mixed_chunks_let_decodes_ride_in_short_prefills() -> None:
    # long prompts of spread lengths beside 32 decoding requests: without mixed chunks a prefill runs
    # alone, every chunk of it back to back, and the decodes wait it out
    spec = RequestSpec(api="generate", input_len=4096, output_len=128, input_dist="lognormal:0.5",
                       output_dist="lognormal:0.5")
    point = LoadPoint(concurrency=32, num_requests=128, warmup_requests=0)
    alone_result = predict_point(LLAMA8, point, spec)
    alone = alone_result.metrics
    small_chunks = predict_point([*LLAMA8, "--chunked-prefill-size", "1024"], point, spec).metrics
    mixed_result = predict_point([*LLAMA8, "--chunked-prefill-size", "1024", "--enable-mixed-chunk"], point,
                                 spec)
    mixed = mixed_result.metrics
    assert alone["itl_p99_ms"] > 10 * alone["itl_p50_ms"]
    # smaller chunks alone shorten no stall: a prompt's chunks still run one after another
    assert small_chunks["itl_p99_ms"] > 0.8 * alone["itl_p99_ms"]
    # mixed in, a decode waits one 1,024-token chunk: the tail falls, TTFT pays a little
    assert mixed["itl_p99_ms"] < 0.4 * alone["itl_p99_ms"]
    assert mixed["ttft_p50_ms"] > alone["ttft_p50_ms"]
    # the same requests, every token
    tokens = [sum(r.output_tokens for r in res.records) for res in (mixed_result, alone_result)]
    assert tokens[0] == tokens[1]


def test_mixed_chunks_need_chunked_prefill() -> None:
    # SGLang: is_mixed_chunk = chunked_prefill_size is set and --enable-mixed-chunk
    assert not load_config([*LLAMA8, "--chunked-prefill-size", "-1", "--enable-mixed-chunk"]).mixed_chunk
    assert load_config([*LLAMA8, "--enable-mixed-chunk"]).mixed_chunk


def test_length_distributions_reach_the_engine() -> None:
    spec = RequestSpec(api="generate", input_len=2048, output_len=64, input_dist="lognormal:0.5",
                       input_max_len=6000)
    r = predict_point(LLAMA8, LoadPoint(concurrency=4, num_requests=64, warmup_requests=0), spec)
    lengths = np.array([rec.input_tokens for rec in r.records])
    assert lengths.min() < 1500 and lengths.max() > 3000 and lengths.max() <= 6000
    assert abs(lengths.mean() / 2048 - 1) < 0.2
