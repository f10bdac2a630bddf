"""The simulator's model in-process: config arithmetic, hardware profiles, cost model, virtual-time DES.

Where a test checks a number, the number was worked out by hand from the model's ``config.json`` and the
hardware profile (the derivation is in the comment next to it), so the test fails if the code's
arithmetic is wrong rather than restating it.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import yaml

from simulator.cli import build_parser
from simulator.costs import decode_shape, distinct_experts, pp_layer_split, prefill_shape
from simulator.entities import Request
from simulator.model_spec import load_model_spec
from simulator.predict import predict_point
from simulator.replica import ReplicaModel
from simulator.resolve import resolve
from simulator.timebase import Simulation
from vocab.hardware import HardwareConf, load_hardware
from vocab.telemetry import STAGE_ACTIVITY_MAX
from workloads import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"
HW_NAMES = ["rtx-pro-6000-pcie-x8", "h200-nvlink-x8", "h100-sxm-x8", "h100-sxm-x8-2nodes-ib"]


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
    spec = load_model_spec(str(MODELS / "kimi-k2"))
    assert spec.attention == "mla" and spec.num_layers == 61 and spec.num_moe_layers == 60
    assert spec.total_params() == pytest.approx(1.03e12, rel=0.01)  # "1T total"
    assert spec.active_params_per_token() == pytest.approx(32e9, rel=0.03)  # "32B activated"
    assert spec.expert_bytes == pytest.approx(24.8e6, rel=0.01)  # INT4 g32 + BF16 scales
    assert spec.kv_elems_per_token_layer() == 576  # kv_lora_rank 512 + rope 64
    assert "int4" in spec.quant_desc and "expert" in spec.quant_desc and "attn" not in spec.quant_desc


def test_qwen3_moe_and_llama_numbers() -> None:
    q = load_model_spec(str(MODELS / "qwen3-30b-a3b"))
    assert q.total_params() == pytest.approx(30.5e9, rel=0.02)
    assert q.active_params_per_token() == pytest.approx(3.0e9, rel=0.1)
    llama = load_model_spec(str(MODELS / "llama-3.1-70b"))
    assert llama.total_params() == pytest.approx(70.6e9, rel=0.01)
    assert llama.kv_elems_per_token_layer() == 2 * 8 * 128


def test_distinct_experts_and_layer_split() -> None:
    # Worked by hand for Kimi (E = 384 routed experts, top-k = 8): 384 * (1 - (1 - 8/384)^b) for
    # b = 1, 4, 8, 16, 32, 64 is 8.0, 31.0, 59.5, 109.8, 188.2, 284.2 experts touched per layer.
    got = [distinct_experts(384, 8, b) for b in (1, 4, 8, 16, 32, 64)]
    for g, want in zip(got, [8.0, 31.0, 59.5, 109.8, 188.2, 284.2], strict=True):
        assert g == pytest.approx(want, rel=0.005)
    # invariants: one token touches exactly k experts; more tokens touch more, never more than n*k or E
    assert distinct_experts(384, 8, 0) == 0.0 and distinct_experts(0, 0, 5) == 0.0
    sizes = range(1, 2000, 7)
    many = [distinct_experts(384, 8, b) for b in sizes]
    assert all(a <= b for a, b in itertools.pairwise(many))
    assert all(a < b for a, b in itertools.pairwise(many[:40]))  # up to 274 tokens: still rising
    assert all(d <= min(n * 8, 384) + 1e-9 for n, d in zip(sizes, many, strict=True))
    assert many[-1] == pytest.approx(384)
    # SGLang's split: even, the remainder on the last stages
    assert pp_layer_split(61, 8) == [7, 7, 7, 8, 8, 8, 8, 8]
    assert pp_layer_split(4, 4) == [1, 1, 1, 1]
    assert pp_layer_split(10, 3) == [3, 3, 4]


def test_auto_defaults_match_hand_computed_numbers() -> None:
    llama = str(MODELS / "llama-3.1-8b")
    # By hand from models/llama-3.1-8b/config.json (hidden 4096, 32 layers, 32 q / 8 kv heads of 128,
    # intermediate 14336, vocab 128256, 131072 positions, BF16) and conf/hardware/h100-sxm-x8.yaml
    # (memory_gb 85.5):
    # * parameters per layer: q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 = 41,943,040, MLP 3*4096*14336 =
    #   176,160,768; 32 layers + embedding + LM head (untied, 128256*4096 each) = 8,029,995,008 (the
    #   published "8.03B"), i.e. 16,059,990,016 bytes;
    # * KV per token: 2 (K, V) * 8 heads * 128 * 2 B * 32 layers = 131,072 B;
    # * GPU memory 85.5e9 B = 81,539.6 MiB: the 60-90 GiB tier, so chunked_prefill_size 8192 and a
    #   decode graph max batch of 256 (tp < 4);
    # * reserved = 512 + 8192*1.5 + tp*pp/8*1024 + 256*2 = 13,440 MiB (over the 10 GiB floor), so
    #   mem_fraction_static = round((81539.6 - 13440) / 81539.6, 3) = 0.835;
    # * KV pool = floor((85.5e9 * 0.835 - 16,059,990,016) / 131,072) = 422,153 tokens;
    # * max_running_requests: 422153 / 131072 * 512 = 1649 is below SGLang's floor of 2048, and 2048 is
    #   below half the pool; with pp = 1 the micro-batch cap is the whole pool of 2048.
    cfg = _cfg("--model-path", llama, "--sim-hardware", "h100-sxm-x8")
    assert cfg.spec.total_params() == 8_029_995_008
    assert cfg.cost.stages[0].weight_bytes == 16_059_990_016
    assert cfg.cost.stages[0].kv_bytes_per_token == 131_072
    assert cfg.chunked_prefill_size == 8192 and cfg.cuda_graph_max_bs_decode == 256
    assert cfg.mem_fraction_static == 0.835
    assert cfg.max_total_num_tokens == 422_153
    assert cfg.max_running_requests == 2048 and cfg.pp_max_micro_batch_size == 2048
    # PP2 with --max-running-requests 32: the defaulted graph max batch is capped to 32, so reserved =
    # 512 + 12288 + 2/8*1024 + 32*2 = 13,120 MiB and the fraction round(68419.6 / 81539.6, 3) = 0.839.
    # Each stage holds 16 layers plus the embedding (stage 0) or the LM head (stage 1): 8,029,995,008 B,
    # and 16 layers of KV, 65,536 B per token: floor((85.5e9 * 0.839 - 8,029,995,008) / 65,536) =
    # 972,053 tokens. The per-slot cap is 32 // pp_size = 16.
    pp2 = _cfg("--model-path", llama, "--sim-hardware", "h100-sxm-x8", "--pp-size", "2",
               "--max-running-requests", "32")
    assert pp2.cuda_graph_max_bs_decode == 32 and pp2.mem_fraction_static == 0.839
    assert [st.weight_bytes for st in pp2.cost.stages] == [8_029_995_008] * 2
    assert pp2.max_total_num_tokens == 972_053
    assert pp2.max_running_requests == 32 and pp2.pp_max_micro_batch_size == 16
    # A request pool larger than half the KV pool is reduced to half of it, with SGLang's warning.
    big = _cfg("--model-path", llama, "--sim-hardware", "h100-sxm-x8", "--max-running-requests", "500000")
    assert big.max_running_requests == 422_153 // 2
    assert any("reduced from the requested 500000 to 211076" in w for w in big.warnings)


def test_kimi_pp8_stage_weights_and_request_pool() -> None:
    cfg = _cfg("--model-path", str(MODELS / "kimi-k2"), "--pp-size", "8",
               "--sim-hardware", "rtx-pro-6000-pcie-x8")
    # The KV pool (about 727K tokens) is under 4 contexts of 262,144 tokens, so SGLang's estimate
    # pool / context * 512 is below its floor of 2048: max_running_requests = 2048, cap 2048 // 8.
    assert cfg.context_len == 262_144 and cfg.max_total_num_tokens < 4 * cfg.context_len
    assert cfg.max_running_requests == 2048 and cfg.pp_max_micro_batch_size == 256
    assert cfg.cuda_graph_max_bs_decode == 256  # tp < 4 on the < 160 GB tier
    user = _cfg("--model-path", str(MODELS / "kimi-k2"), "--pp-size", "8",
                "--sim-hardware", "rtx-pro-6000-pcie-x8", "--max-running-requests", "32")
    assert user.max_running_requests == 32 and user.pp_max_micro_batch_size == 4
    assert user.cuda_graph_max_bs_decode == 32  # defaulted max bs is capped to max_running_requests
    # Stages 3 and 7 both hold 8 MoE layers; the last also holds the LM head, 163840 x 7168 BF16 =
    # 2,348,810,240 bytes. Stage 0 holds 7 layers (the first dense) and the embedding of the same size.
    st = cfg.cost.stages
    assert st[7].weight_bytes - st[3].weight_bytes == 163_840 * 7168 * 2
    assert st[3].weight_bytes == st[4].weight_bytes == st[5].weight_bytes == st[6].weight_bytes
    assert max(st, key=lambda s: s.weight_bytes) is st[7]


def test_mla_kv_is_replicated_under_tp_but_split_under_pp() -> None:
    kimi = str(MODELS / "kimi-k2")
    tp8 = _cfg("--model-path", kimi, "--tp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8")
    pp8 = _cfg("--model-path", kimi, "--pp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8")
    # MLA caches one latent of 512 + 64 BF16 values per token and layer, the same on every TP rank:
    # under TP8 each GPU stores all 61 layers (70,272 B per token), under PP8 only its 7 or 8 (8,064 or
    # 9,216 B). PP8 therefore holds several times the tokens (about 727K against 181K).
    assert tp8.cost.stages[0].kv_bytes_per_token == 61 * 576 * 2
    assert [s.kv_bytes_per_token for s in pp8.cost.stages] == [n * 576 * 2 for n in (7, 7, 7, 8, 8, 8, 8, 8)]
    assert pp8.max_total_num_tokens > 3 * tp8.max_total_num_tokens


def _predict(argv: list[str], concurrency: int, input_len: int, output_len: int, requests: int) -> dict:
    spec = RequestSpec(api="generate", input_len=input_len, output_len=output_len)
    point = LoadPoint(num_requests=requests, concurrency=concurrency)
    return predict_point([*argv, "--random-seed", "3"], point, spec).metrics


def test_pp8_ring_and_bubbles_in_virtual_time() -> None:
    kimi = str(MODELS / "kimi-k2")
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
    # at depth 0 the last stage's host waits for its own forward (its output send is queued behind it),
    # then processes a result and builds, receives and prepares the next micro-batch before launching it
    h = mb1.cost.host_costs()
    gap = h.process(1) + h.gloo_recv + h.schedule(1) + h.object_recv + h.prepare(1)
    assert p["tpot_p50_ms"] / 1e3 == pytest.approx(8 * (last + gap), rel=0.05)
    assert p[STAGE_ACTIVITY_MAX] == pytest.approx(last / (last + gap), abs=0.03)


def test_overlap_scheduler_hides_host_time_at_pp1() -> None:
    llama = str(MODELS / "llama-3.1-8b")
    base = ["--model-path", llama, "--sim-hardware", "h100-sxm-x8"]
    on = _cfg(*base)
    a = _predict(base, concurrency=4, input_len=128, output_len=128, requests=4)
    b = _predict([*base, "--disable-overlap-schedule"], concurrency=4, input_len=128, output_len=128,
                 requests=4)
    host = on.cost.sched_time(4) * 1e3
    assert b["tpot_p50_ms"] - a["tpot_p50_ms"] == pytest.approx(host, rel=0.05)
    assert a["tpot_p50_ms"] / 1e3 == pytest.approx(on.cost.stage_time(0, decode_shape([192] * 4)), rel=0.05)


def test_admission_respects_request_pool_and_slot_cap() -> None:
    kimi = str(MODELS / "kimi-k2")
    cfg = _cfg("--model-path", kimi, "--pp-size", "8", "--sim-hardware", "rtx-pro-6000-pcie-x8",
               "--max-running-requests", "16", "--pp-async-batch-depth", "2")
    assert cfg.pp_max_micro_batch_size == 2  # 16 // pp_size, not // (pp_size + depth)
    sim = Simulation()
    rep = ReplicaModel(cfg, sim)
    adm = rep.admission
    reqs = [Request(f"r{i}", 100, 50, i) for i in range(40)]
    for r in reqs:
        rep.submit(r, 0.0)
    peak_pool = peak_slot = 0
    while sim.peek() is not None:
        sim.run_until(sim.peek())
        peak_pool = max(peak_pool, adm.pool_used)
        peak_slot = max(peak_slot, *(len(s.reqs) for s in rep.slots))
        assert adm.kv_used <= adm.kv_committed <= adm.kv_capacity
    assert all(r.finished and len(r.output_ids) == 50 for r in reqs)
    assert peak_pool == 16 and peak_slot == 2  # the request pool caps the total; 10 slots run short
    assert adm.pool_used == 0 and adm.kv_used == 0 and adm.kv_committed == 0


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_that_comes_during_a_step_waits_for_the_batch_already_built(overlap: bool) -> None:
    """The overlap scheduler (SGLang's event loop, vLLM's async scheduling) builds the batch after the
    running one when the running one starts, before its results are in: a request that comes while a step
    runs misses the batch built already and is prefilled in the one after it. Without the overlap the
    next batch is built when the step ends, and takes it."""
    flags = [] if overlap else ["--disable-overlap-schedule"]
    cfg = _cfg("--model-path", str(MODELS / "llama-3.1-8b"), "--sim-hardware", "h100-sxm-x8", *flags)
    sim = Simulation()
    rep = ReplicaModel(cfg, sim)
    first, late = Request("first", 256, 64, 0), Request("late", 256, 64, 1)
    rep.submit(first, 0.0)
    sim.run_until(0.05)  # first is decoding, one step after another
    step = cfg.cost.stage_time(0, decode_shape([300])) + (0.0 if overlap else cfg.cost.sched_time(1))
    sent = sim.now + step / 2  # halfway through a decode step
    rep.submit(late, sent)
    while sim.peek() is not None:
        sim.run_until(sim.peek())
    prefill = cfg.cost.stage_time(0, prefill_shape([(256, 0)]))
    waited = late.first_token_time - sent - prefill  # what it waited before its prefill ran
    # the rest of the running step, then (overlap) the whole step built before it came
    assert waited == pytest.approx(step / 2 + (step if overlap else 0.0), rel=0.2)
