"""The simulator's model in-process: config arithmetic, hardware profiles, cost model, virtual-time DES."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the simulator package lives at the repository root

from simulator.cli import build_parser  # noqa: E402
from simulator.clock import Simulation  # noqa: E402
from simulator.costs import decode_shape, distinct_experts, pp_layer_split  # noqa: E402
from simulator.engine import Engine, Request  # noqa: E402
from simulator.model_spec import load_model_spec  # noqa: E402
from simulator.predict import predict_point  # noqa: E402
from simulator.resolve import resolve  # noqa: E402
from vocab.hardware import HardwareConf, load_hardware  # noqa: E402
from workloads import LoadPoint, RequestSpec  # noqa: E402

HW_NAMES = ["rtx-pro-6000-pcie-x8", "h200-nvlink-x8", "h100-sxm-x8"]


def _cfg(*args: str):
    return resolve(build_parser().parse_args([*args, "--random-seed", "3"]))


@pytest.mark.parametrize("name", HW_NAMES)
def test_hardware_profiles_have_exactly_the_schema_fields(name: str) -> None:
    data = yaml.safe_load((REPO / "conf" / "hardware" / f"{name}.yaml").read_text())
    assert set(data) == {f.name for f in dataclasses.fields(HardwareConf)}
    assert "defaults" not in data
    hw = load_hardware(name)
    assert hw.name == name and hw.num_gpus == 8 and hw.source.startswith("NVIDIA")
    assert hw.graph_launch_us < hw.kernel_launch_us * 10


def test_kimi_k2_architecture_numbers() -> None:
    spec = load_model_spec(str(REPO / "models" / "kimi-k2"))
    assert spec.attention == "mla" and spec.num_layers == 61 and spec.num_moe_layers == 60
    assert spec.total_params() == pytest.approx(1.03e12, rel=0.01)  # "1T total"
    assert spec.active_params_per_token() == pytest.approx(32e9, rel=0.03)  # "32B activated"
    assert spec.expert_bytes == pytest.approx(24.8e6, rel=0.01)  # INT4 g32 + BF16 scales
    assert spec.kv_elems_per_token_layer() == 576  # kv_lora_rank 512 + rope 64
    assert "int4" in spec.quant_desc and "expert" in spec.quant_desc and "attn" not in spec.quant_desc


def test_qwen3_moe_and_llama_numbers() -> None:
    q = load_model_spec(str(REPO / "models" / "qwen3-30b-a3b"))
    assert q.total_params() == pytest.approx(30.5e9, rel=0.02)
    assert q.active_params_per_token() == pytest.approx(3.0e9, rel=0.1)
    llama = load_model_spec(str(REPO / "models" / "llama-3.1-70b"))
    assert llama.total_params() == pytest.approx(70.6e9, rel=0.01)
    assert llama.kv_elems_per_token_layer() == 2 * 8 * 128


def test_distinct_experts_and_layer_split() -> None:
    # simulation.md 2.3: Kimi (E=384, k=8): D = 8, 31, 59.5, 110, 188, 284 for b = 1..64
    got = [distinct_experts(384, 8, b) for b in (1, 4, 8, 16, 32, 64)]
    for g, want in zip(got, [8, 31, 59.5, 110, 188, 284], strict=True):
        assert g == pytest.approx(want, rel=0.02)
    assert pp_layer_split(61, 8) == [7, 7, 7, 8, 8, 8, 8, 8]
    assert pp_layer_split(4, 4) == [1, 1, 1, 1]


def test_auto_defaults_follow_sglang_formulas() -> None:
    cfg = _cfg("--model-path", str(REPO / "models" / "kimi-k2"), "--pp-size", "8",
               "--sim-hardware", "rtx-pro-6000-pcie-x8")
    cap = cfg.max_total_num_tokens
    assert cfg.max_running_requests == min(min(max(int(cap / cfg.context_len * 512), 2048), 4096), cap // 2)
    assert cfg.pp_max_micro_batch_size == max(cfg.max_running_requests // 8, 1)
    assert cfg.cuda_graph_max_bs_decode == 256  # tp < 4 on the < 160 GB tier
    user = _cfg("--model-path", str(REPO / "models" / "kimi-k2"), "--pp-size", "8",
                "--sim-hardware", "rtx-pro-6000-pcie-x8", "--max-running-requests", "32")
    assert user.max_running_requests == 32 and user.pp_max_micro_batch_size == 4
    assert user.cuda_graph_max_bs_decode == 32  # defaulted max bs is capped to max_running_requests
    # the LM head makes the last stage the heaviest
    st = cfg.cost.stages
    assert st[-1].weight_bytes > st[3].weight_bytes > st[0].weight_bytes - st[0].weight_bytes * 0.2


def test_mla_kv_is_replicated_under_tp_but_split_under_pp() -> None:
    kimi = str(REPO / "models" / "kimi-k2")
    tp8 = _cfg("--model-path", kimi, "--tp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8")
    pp8 = _cfg("--model-path", kimi, "--pp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8")
    assert pp8.max_total_num_tokens > 3 * tp8.max_total_num_tokens  # simulation.md 2.4: ~170K vs ~1.4M


def _predict(argv: list[str], concurrency: int, input_len: int, output_len: int, requests: int) -> dict:
    spec = RequestSpec(api="generate", input_len=input_len, output_len=output_len)
    point = LoadPoint(num_requests=requests, concurrency=concurrency)
    return predict_point([*argv, "--random-seed", "3"], point, spec).metrics


def test_pp8_ring_and_bubbles_in_virtual_time() -> None:
    kimi = str(REPO / "models" / "kimi-k2")
    base = ["--model-path", kimi, "--pp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8"]
    cfg = _cfg(*base)
    one = _predict(base, concurrency=1, input_len=200, output_len=64, requests=2)
    # a single request: every token is one ring trip, host time included; stages ~1/8 busy
    ring = cfg.cost.ring_trip(decode_shape([232]))
    assert one["tpot_p50_ms"] / 1e3 == pytest.approx(ring, rel=0.03)
    # 8 micro-batches of one request: the slowest stage (LM head) paces the ring and is nearly always busy
    mb1 = _cfg(*base, "--pp-max-micro-batch-size", "1")
    p = _predict([*base, "--pp-max-micro-batch-size", "1"], concurrency=8, input_len=200, output_len=256,
                 requests=8)
    last = mb1.cost.stage_time(7, decode_shape([328]))
    assert p["tpot_p50_ms"] / 1e3 == pytest.approx(8 * last, rel=0.1)
    assert p["sim_stage_busy_max"] > 0.8


def test_overlap_scheduler_hides_host_time_at_pp1() -> None:
    llama = str(REPO / "models" / "llama-3.1-8b")
    base = ["--model-path", llama, "--sim-hardware", "h100-sxm-x8"]
    on = _cfg(*base)
    a = _predict(base, concurrency=4, input_len=128, output_len=128, requests=4)
    b = _predict([*base, "--disable-overlap-schedule"], concurrency=4, input_len=128, output_len=128,
                 requests=4)
    host = on.cost.sched_time(4) * 1e3
    assert b["tpot_p50_ms"] - a["tpot_p50_ms"] == pytest.approx(host, rel=0.05)
    assert a["tpot_p50_ms"] / 1e3 == pytest.approx(on.cost.stage_time(0, decode_shape([192] * 4)), rel=0.05)


def test_admission_respects_request_pool_and_slot_cap() -> None:
    kimi = str(REPO / "models" / "kimi-k2")
    cfg = _cfg("--model-path", kimi, "--pp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8",
               "--max-running-requests", "16", "--pp-async-batch-depth", "2")
    assert cfg.pp_max_micro_batch_size == 2  # 16 // pp_size, not // (pp_size + depth)
    sim = Simulation()
    eng = Engine(cfg, sim)
    reqs = [Request(f"r{i}", 100, 50, i) for i in range(40)]
    for r in reqs:
        eng.submit(r, 0.0)
    peak_pool = peak_slot = 0
    while sim.peek() is not None:
        sim.run_until(sim.peek())
        peak_pool = max(peak_pool, eng.pool_used)
        peak_slot = max(peak_slot, *(len(s.reqs) for s in eng.slots))
        assert eng.kv_used <= eng.kv_committed <= eng.kv_capacity
    assert all(r.finished and len(r.output_ids) == 50 for r in reqs)
    assert peak_pool == 16 and peak_slot == 2  # the request pool caps the total; 10 slots run short
    assert eng.pool_used == 0 and eng.kv_used == 0 and eng.kv_committed == 0
