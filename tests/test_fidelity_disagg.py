"""A disaggregated run replayed the way it was measured: a corpus entry with a ``disaggregation`` block
becomes a prefill and a decode server, each with its own layout and flags, behind the router's pairing,
and the client's requests go through the deployment in virtual time.

The run is one of aiconfigurator-core's served SGLang rows (``systems/silicon_sample.csv``, id
``dsr1_h200_sglang_fp8_disagg_8192x1024_c128_cfg434``: DeepSeek-V3 on H200, SGLang 0.5.8.post1, one
prefill server TP8 and one decode server of eight attention-DP ranks with EP8, 8,192 tokens in and 1,024
out at 128 streams, TTFT 3,644 ms and TPOT 40.6 ms measured), with its roles' flags from the srt-slurm
recipe it names (``recipes/h200/8k1k``: prefill at 0.75 of memory with 16 running requests, decode at
0.88 with 256, both without a radix cache, NIXL); the client's prompt count is cut to two per stream
here to keep the test short."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.corpus import CorpusError, Entry, read_corpus
from orchestrator.fidelity.replay import plan, predict
from orchestrator.fidelity.silicon import INFERENCEX_RANGE_RATIO, INFERENCEX_SEED, INFERENCEX_TOOL

ROW = {
    "id": "dsr1_h200_sglang_fp8_disagg_8192x1024_c128_cfg434", "source_url": "aiconfigurator-core "
    "systems/silicon_sample.csv", "model": "deepseek-ai/DeepSeek-V3", "gpu": "NVIDIA H200", "gpu_count": 16,
    "nodes": 2, "sglang_version": "0.5.8.post1", "server_args": {"disable_radix_cache": True},
    "disaggregation": {
        "transfer_backend": "nixl",
        "prefill": {"workers": 1, "tp": 8, "ep": 1, "server_args": {
            "mem_fraction_static": 0.75, "max_running_requests": 16, "chunked_prefill_size": 163840,
            "max_prefill_tokens": 163840}},
        "decode": {"workers": 1, "tp": 8, "ep": 8, "attention": 8, "server_args": {
            "mem_fraction_static": 0.88, "max_running_requests": 256, "cuda_graph_max_bs": 256,
            "stream_interval": 10}}},
    "workload": {"tool": INFERENCEX_TOOL, "dataset": "random", "num_prompts": 2 * 128,
                 "random_input_len": 8192, "random_output_len": 1024,
                 "random_range_ratio": INFERENCEX_RANGE_RATIO, "request_rate": "inf", "max_concurrency": 128,
                 "seed": INFERENCEX_SEED},
    "measured": {"mean_ttft_ms": 3644.366308, "mean_tpot_ms": 40.623749},
    "parasweep": {"model": "deepseek-v3", "hardware": "h200-nvlink-x8"},
}


def test_a_disaggregated_run_is_replayed_as_its_roles_were_launched(tmp_path: Path) -> None:
    entry = Entry.model_validate(ROW)
    roles = plan(entry, tmp_path).roles
    assert roles is not None and (roles.prefill_workers, roles.decode_workers) == (1, 1)
    decode, prefill = roles.decode_argv, roles.prefill_argv
    assert decode[decode.index("--attn-dp-size") + 1] == "8" and decode[decode.index("--ep-size") + 1] == "8"
    assert decode[decode.index("--disaggregation-mode") + 1] == "decode"
    assert decode[decode.index("--mem-fraction-static") + 1] == "0.88"
    assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"
    assert "--attn-dp-size" not in prefill
    assert prefill[prefill.index("--max-running-requests") + 1] == "16"
    assert all("--disable-radix-cache" in argv for argv in (prefill, decode))
    p, predicted = predict(entry)
    assert p.layout == "disaggregated attention DP" and p.family == "moe"
    assert any("2 nodes" in note for note in p.notes)  # the network between them, said
    for metric in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput"):
        assert math.isfinite(predicted[metric]) and predicted[metric] > 0
    # every prompt of 8,192 tokens waits for the one prefill server: the TTFT is its queue, far above a
    # decode step; each decode step serves 128 streams over eight ranks
    assert predicted["mean_ttft_ms"] > 10 * predicted["mean_tpot_ms"]


def test_what_a_disaggregated_entry_may_not_say(tmp_path: Path) -> None:
    wide = {**ROW, "nodes": 1}
    with pytest.raises(NotModelled, match="its servers take 2 nodes of 8 GPUs; 1 published"):
        plan(Entry.model_validate(wide), tmp_path)
    bad = {**ROW, "disaggregation": {**ROW["disaggregation"], "decode": {"workers": 1, "tp": 8, "rank": 8}}}
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(CorpusError, match=r"disaggregation\.decode\.rank"):
        read_corpus(f)
