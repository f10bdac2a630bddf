"""The simulated engine playing vLLM, in virtual time: its flags and defaults per release, vLLM's
scheduler (one token budget per step shared by decodes and prefill chunks, ``--max-num-seqs``,
preemption by recompute, the full-prompt check from 0.19), its metric names against each recorded
release, and its stats line read back by the parser that reads real vLLM logs."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.engines.vllm_compat.versions import RECORDED, release
from orchestrator.telemetry.vllm_log import resolved_from_vllm_log, stats_row, vllm_log_frame
from simulator.costs import prefill_shape
from simulator.entities import Batch
from simulator.predict import VirtualTrial, load_config
from simulator.vllm.logs import VLLMLogWriter
from simulator.vllm.metrics import VLLMMetrics
from simulator.vllm.releases import PLAYED
from simulator.vllm.reporter import StatsLine, VLLMReporter
from simulator.vllm.scheduler import VLLMReplica
from vocab.load import LoadPoint, RequestSpec

MODEL = "models/llama-3.1-8b"
REAL_LOG = Path(__file__).parent / "data" / "vllm" / "real-logs" / "stats-lines.log"


def _serve(*flags: str, hardware: str = "h100-sxm-x8") -> list[str]:
    return ["serve", MODEL, "--sim-hardware", hardware, *flags]


def _recording(trial: VirtualTrial) -> list[Batch]:
    """Every step engine core 0 builds, kept as it is built."""
    rep = trial.replicas[0]
    assert isinstance(rep, VLLMReplica)
    built: list[Batch] = []
    build = rep.admission.build_step

    def record(slot, now):  # type: ignore[no-untyped-def]
        batch = build(slot, now)
        if batch is not None:
            built.append(batch)
        return batch

    rep.admission.build_step = record  # type: ignore[method-assign]
    return built


def test_the_defaults_follow_the_release_and_the_gpu() -> None:
    h100 = load_config(_serve("--sim-vllm-release", "0.12.0"))
    assert (h100.max_running_requests, h100.chunked_prefill_size, h100.page_size) == (1024, 8192, 16)
    assert h100.disable_overlap_schedule  # async scheduling off by default up to 0.12
    assert not load_config(_serve("--sim-vllm-release", "0.15.1")).disable_overlap_schedule
    assert load_config(_serve("--no-async-scheduling")).disable_overlap_schedule
    a40 = load_config(_serve(hardware="a40-pcie-x4"))  # 48 GB: under vLLM's 70 GiB line
    assert (a40.max_running_requests, a40.chunked_prefill_size) == (256, 2048)
    assert load_config(_serve("--no-enable-prefix-caching")).radix_cache is False
    more = load_config(_serve("--gpu-memory-utilization", "0.95")).max_total_num_tokens
    assert more > h100.max_total_num_tokens  # a larger share of the GPU is a larger KV cache


@pytest.mark.parametrize(("flags", "says"), [
    (["--hf-overrides", "{}"], "overrides already applied"),
    (["--moe-backend", "deep_gemm"], "--moe-backend deep_gemm is not modelled by the simulated engine"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
    (["--gpu-memory-utilization", "0.02"], "leaves no memory for the KV cache"),
    (["--gpu-memory-utilization", "0.1"], "No available memory for the cache blocks"),  # vLLM's words
    (["--max-num-seq", "8"], "unrecognized arguments: --max-num-seq"),  # no abbreviation, as vLLM
    (["--sim-vllm-release", "0.10.0"], "invalid choice"),
])
def test_what_vllm_or_the_simulator_refuses_is_refused(flags: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_config(_serve(*flags))


def test_a_step_shares_one_token_budget_between_decodes_and_prompt_chunks() -> None:
    cfg = load_config(_serve("--max-num-batched-tokens", "512", "--seed", "1"))
    trial = VirtualTrial(cfg)
    steps = _recording(trial)
    result = trial.run_point(LoadPoint(concurrency=8, num_requests=24),
                             RequestSpec(api="completions", input_len=1500, output_len=64, seed=3))
    assert result.metrics["completed"] == 24
    tokens = [sum(it.tokens for it in b.items) + len(b.mixed) + (len(b.reqs) if b.decode else 0)
              for b in steps]
    assert max(tokens) == 512  # the budget is spent, never exceeded
    mixed = [b for b in steps if not b.decode and b.mixed]
    assert mixed  # running requests decode in the same step as another's prompt chunk
    # decodes take their token first: a mixed step's chunk is what the budget leaves after them
    assert all(sum(it.tokens for it in b.items) <= 512 - len(b.mixed) for b in mixed)
    chunked = [it for b in steps for it in b.items if not it.last_chunk]
    assert chunked  # a 1,500-token prompt never fits a 512-token step whole


def test_max_num_seqs_caps_the_requests_running_at_once() -> None:
    trial = VirtualTrial(load_config(_serve("--max-num-seqs", "6")))
    result = trial.run_point(LoadPoint(concurrency=16, num_requests=32),
                             RequestSpec(api="completions", input_len=200, output_len=64, seed=2))
    adm = trial.replicas[0].admission
    assert result.metrics["completed"] == 32
    assert adm.peak_pool_used == 6
    assert result.metrics["server_queue_mean_ms"] > 0  # the other ten waited their turn


def _preemptions(*flags: str, input_len: int = 2000, output_len: int = 1500, concurrency: int = 48,
                 requests: int = 96) -> tuple[int, dict[str, float], VirtualTrial]:
    trial = VirtualTrial(load_config(_serve(*flags)))
    result = trial.run_point(LoadPoint(concurrency=concurrency, num_requests=requests),
                             RequestSpec(api="completions", input_len=input_len, output_len=output_len,
                                         seed=1))
    return trial.replicas[0].admission.preemptions, result.metrics, trial  # type: ignore[attr-defined]


def test_a_full_kv_cache_preempts_by_recompute_and_every_request_still_completes() -> None:
    small, metrics, trial = _preemptions("--gpu-memory-utilization", "0.28")
    assert trial.cfg.max_total_num_tokens < 48 * 3500  # the streams' full contexts do not fit at once
    assert small > 0
    assert metrics["completed"] == 96 and metrics["errors"] == 0
    assert metrics["output_tokens_total"] == 96 * 1500  # recomputed requests lose no token
    assert metrics["kv_token_usage_max"] == pytest.approx(1.0, abs=0.01)
    roomy, _, _ = _preemptions()  # 0.9 of an H100: ~440k tokens
    assert roomy == 0


def test_from_0_19_a_request_waits_until_its_whole_prompt_fits() -> None:
    """Long prompts, a KV cache a few of them fill: admitted on their first chunk (0.18), they take the
    cache in pieces and preempt each other; held back until the whole prompt fits (0.19), far less."""
    flags = ("--gpu-memory-utilization", "0.25", "--max-num-batched-tokens", "2048")
    before, _, _ = _preemptions(*flags, "--sim-vllm-release", "0.18.0", input_len=12000, output_len=400,
                                concurrency=16, requests=32)
    after, _, _ = _preemptions(*flags, "--sim-vllm-release", "0.19.0", input_len=12000, output_len=400,
                               concurrency=16, requests=32)
    assert before > 0 and after < before


def _scrape(trial_replicas: list[VLLMReplica], max_model_len: int) -> dict[str, str]:
    metrics = VLLMMetrics("m", trial_replicas, max_model_len)
    reporter = VLLMReporter(metrics, 0)
    for rep in trial_replicas:
        rep.observer = reporter
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("version", RECORDED)
def test_every_series_the_simulated_engine_serves_is_one_the_release_registers(version: str) -> None:
    assert version in PLAYED
    trial = VirtualTrial(load_config(_serve("--sim-vllm-release", version)))
    served = _scrape(trial.replicas, trial.cfg.context_len)  # type: ignore[arg-type]
    recorded = release(version).metrics  # read from the release's wheel
    assert served and {n: recorded.get(n) for n in served} == served


def test_real_stats_lines_are_read_field_by_field() -> None:
    rows = [r for r in (stats_row(line, 1.8e9) for line in REAL_LOG.read_text().splitlines()) if r]
    assert len(rows) == 6
    first = rows[0]
    assert (first["running_req"], first["queue_req"], first["dp"]) == (10, 90, 0)
    assert first["prompt_throughput"] == 23998.2 and first["gen_throughput"] == 18.1
    assert first["token_usage"] == pytest.approx(0.193) and first["preemptions"] == 0
    assert rows[-1]["prefix_cache_hit_rate"] == pytest.approx(0.857)
    assert [r["ts"] for r in rows[:2]][1] - rows[0]["ts"] == 10  # the 10 s interval, to the second
    resolved = resolved_from_vllm_log(REAL_LOG.read_text().splitlines())
    assert resolved == {"max_total_num_tokens": 30960, "kv_cache_max_concurrency": 1.89}


def test_the_simulated_stats_line_reads_back_as_a_real_one(tmp_path: Path) -> None:
    _, _, trial = _preemptions("--gpu-memory-utilization", "0.28", requests=48)
    rep = trial.replicas[0]
    out = io.StringIO()
    log = VLLMLogWriter(stream=out)
    log.wall = lambda: 1.8e9
    reporter = VLLMReporter(VLLMMetrics("m", [rep], trial.cfg.context_len), 0)  # type: ignore[list-item]
    reporter.generated = 48 * 1500
    line = StatsLine(rep, reporter, 0, "0.19.0", log)  # type: ignore[arg-type]
    line.tick(trial.sim.now)
    path = tmp_path / "server.log"
    path.write_text(out.getvalue())
    row = vllm_log_frame(path).iloc[0]
    adm = rep.admission
    assert row["preemptions"] == adm.preemptions > 0  # printed only where there were any
    assert row["gen_throughput"] == pytest.approx(48 * 1500 / trial.sim.now, rel=1e-3)
    assert (row["running_req"], row["queue_req"]) == (adm.num_running, len(adm.waiting))  # type: ignore[attr-defined]
    assert out.getvalue().startswith("(APIServer pid=")


def test_a_step_a_full_graph_does_not_replay_is_priced_as_vllm_s_graph_pieces() -> None:
    cfg = load_config(_serve("--tensor-parallel-size", "2"))
    cost, hw, p = cfg.cost, cfg.hw, cfg.cost.p
    assert cost.piecewise and cost.cuda_graph_max_bs == 512  # min(2 x 1024 sequences, 512)
    layers = cost.stages[0].layers
    small, large = prefill_shape([(500, 0)]), prefill_shape([(2048, 0)])
    # up to the largest captured size: the attention op eagerly in each layer, a graph piece around it
    pieces = (layers * p.kernels_attn_split * (p.host_op_us + hw.kernel_launch_us)
              + (layers + 1) * hw.graph_launch_us) * 1e-6
    assert cost.host_time(0, small) == pytest.approx(pieces, rel=1e-12)
    work = cost.gpu_time(0, small) + cost.comm_time(0, small)
    assert cost.stage_time(0, small) == pytest.approx(max(work, pieces), rel=1e-12)
    # above it: the compiled model without graphs, priced as an eager step (its dispatch after the work)
    eager = cost.stages[0].kernels * (p.host_op_us + hw.kernel_launch_us) * 1e-6
    assert cost.host_time(0, large) == pytest.approx(eager, rel=1e-12)
    work = cost.gpu_time(0, large) + cost.comm_time(0, large)
    after = max(work, eager) + p.prefill_overlap_loss * min(work, eager)
    assert cost.stage_time(0, large) == pytest.approx(after, rel=1e-12)
    # --enforce-eager, and SGLang: no pieces
    assert not load_config(_serve("--tensor-parallel-size", "2", "--enforce-eager")).cost.piecewise
    sglang = load_config(["--model-path", MODEL, "--sim-hardware", "h100-sxm-x8", "--tp-size", "2"])
    assert not sglang.cost.piecewise
    assert sglang.cost.host_time(0, small) == pytest.approx(eager, rel=1e-12)


@pytest.mark.parametrize(("release_", "hardware", "flags", "priced"), [
    ("0.19.0", "b200-sxm-x8", [], "flashinfer_trtllm"),  # the oracle's first choice on Blackwell
    ("0.17.0", "b300-sxm-x8", [], "flashinfer_trtllm"),
    ("0.16.0", "b200-sxm-x8", [], "auto"),  # before the oracle FlashInfer's were opt-in
    ("0.19.0", "h200-nvlink-x8", ["--enable-expert-parallel"], "auto"),  # Hopper: not priced as vLLM picks
    ("0.19.0", "b200-sxm-x8", ["--moe-backend", "triton"], "triton"),  # what was asked for
])
def test_auto_moe_kernels_are_the_fp8_oracle_s_choice_on_blackwell(release_: str, hardware: str,
                                                                  flags: list[str], priced: str) -> None:
    cfg = load_config(["serve", "models/minimax-m2.5", "--sim-hardware", hardware, "--sim-vllm-release",
                       release_, "--tensor-parallel-size", "2", *flags])
    assert cfg.args.vllm_moe_backend == priced
