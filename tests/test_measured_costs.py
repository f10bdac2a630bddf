"""The measured step-cost source: measured kernel latencies come back exactly, interpolated ones lie between
their measured neighbours, uncovered operators fall back to the roofline and are reported, and the
choice (``--sim-step-costs`` / ``simulator.step_costs``) is honoured or refused in one line.

The tables are aiconfigurator-core's own (installed with parasweep on Linux x86-64); the expected values
are read from the same Parquet files here, independently of ``kernel_tables.py``'s interpolators.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.errors import ConfigError
from simulator.costs import QK_NORM_KERNELS, decode_shape, prefill_shape
from simulator.kernel_lanes import LANES
from simulator.kernel_tables import KernelTables, nearest_version, systems_dir, uncorroborated_spikes
from simulator.predict import load_config
from vocab.hardware import load_hardware

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = systems_dir()
pytestmark = pytest.mark.skipif(SYSTEMS is None, reason="aiconfigurator-core is not installed here (its "
                                "wheels are Linux x86-64 only): the measured step costs cannot be tested")
H100 = "h100_sxm"
TABLES = KernelTables(H100, "0.5.23", LANES["sglang"])


def rows(family: str, name: str, **keys: object) -> list[dict]:
    path = SYSTEMS / "data" / H100 / family / "sglang" / "0.5.14" / f"{name}.parquet"  # type: ignore[operator]
    table = pq.read_table(path, filters=[(k, "=", v) for k, v in keys.items()])
    return table.to_pylist()


def neighbours(points: dict[float, float]) -> tuple[float, float, float, float]:
    """Two adjacent measured counts in the middle of a curve and their latencies (seconds)."""
    xs = sorted(points)
    a, b = xs[len(xs) // 2], xs[len(xs) // 2 + 1]
    return a, points[a] * 1e-3, b, points[b] * 1e-3


def check_curve(query, points: dict[float, float], proportional_above: bool = False) -> None:  # type: ignore[no-untyped-def]
    """A measured count comes back exactly; the geometric middle of two neighbours lies between them;
    beyond the largest count: nothing (the caller's roofline), or a token count priced in proportion."""
    for x, ms in list(points.items())[:5]:
        assert query(x) == pytest.approx(ms * 1e-3, rel=1e-12)
    a, ya, b, yb = neighbours(points)
    mid = query(math.sqrt(a * b))
    assert min(ya, yb) <= mid <= max(ya, yb)
    top = max(points)
    if proportional_above:
        assert query(top * 2) == pytest.approx(2 * points[top] * 1e-3, rel=1e-12)
    else:
        assert query(top * 2) is None


def test_gemm_measured_and_interpolated() -> None:
    table = TABLES.gemm("bfloat16")
    assert table is not None
    measured = {float(r["m"]): r["latency"] for r in rows("gemm", "gemm_perf", gemm_dtype="bfloat16",
                                                           n=8192, k=8192)}
    check_curve(lambda m: table(m, 8192, 8192), measured, proportional_above=True)
    # between two measured widths, at a measured row count: between the two
    at_n = {n: table(64, n, 8192) for n in (6144, 7168, 8192)}
    assert min(at_n[6144], at_n[8192]) <= at_n[7168] <= max(at_n[6144], at_n[8192])  # type: ignore[type-var]


@pytest.mark.parametrize("phase", ["context", "generation"])
def test_attention_measured_and_interpolated(phase: str) -> None:
    surface = TABLES.attention(phase, 16, 2, 128, "bfloat16", "fa3")
    assert surface is not None
    along = "isl" if phase == "context" else "step"
    data = [r for r in rows("attention", f"{phase}_attention_perf", num_heads=16, num_key_value_heads=2,
                            head_dim=128, kv_cache_dtype="bfloat16", attn_dtype="bfloat16",
                            window_size=0, kernel_source="fa3", batch_size=8)]
    check_curve(lambda x: surface(8, x), {float(r[along]): r["latency"] for r in data})


@pytest.mark.parametrize("phase", ["context", "generation"])
def test_mla_measured_and_interpolated(phase: str) -> None:
    surface = TABLES.mla(phase, 8, "bfloat16")
    assert surface is not None
    along = "isl" if phase == "context" else "step"
    data = rows("mla", f"{phase}_mla_perf", num_heads=8, kv_cache_dtype="bfloat16", mla_dtype="bfloat16",
                batch_size=16)
    check_curve(lambda x: surface(16, x), {float(r[along]): r["latency"] for r in data})


def test_moe_measured_and_interpolated() -> None:
    # Qwen3-30B-A3B's experts under EP8: 2048 x 768, top-8 of 128
    curve = TABLES.moe("bfloat16", 2048, 768, 8, 128, 1, 8, "balanced")
    assert curve is not None
    data = rows("moe", "moe_perf", moe_dtype="bfloat16", hidden_size=2048, inter_size=768, topk=8,
                num_experts=128, moe_tp_size=1, moe_ep_size=8, distribution="balanced",
                kernel_source="sglang_fused_moe_triton")
    check_curve(curve, {float(r["num_tokens"]): r["latency"] for r in data}, proportional_above=True)


@pytest.mark.parametrize("graph", [True, False])
def test_allreduce_measured_and_interpolated(graph: bool) -> None:
    curve = TABLES.allreduce(8, graph)
    assert curve is not None
    data = rows("comm", "custom_allreduce_perf", num_gpus=8, allreduce_dtype="bfloat16",
                backend="sglang_graph" if graph else "sglang_eager")
    spikes = uncorroborated_spikes(TABLES.allreduce_points(8, graph), TABLES.allreduce_points(8, not graph))
    check_curve(curve, {float(r["message_size"]): r["latency"] for r in data
                        if float(r["message_size"]) not in spikes})


def test_a_one_sample_allreduce_spike_is_dropped() -> None:
    """H100 SXM's graph table reads 38.1 us at 512 elements between 3.3 and 3.5 us, where the eager table
    of the same sizes is flat: a hiccup of one sample. The lookup there follows its neighbours."""
    graph, eager = TABLES.allreduce_points(8, True), TABLES.allreduce_points(8, False)
    assert graph[512.0] > 5 * max(graph[256.0], graph[1024.0])
    assert uncorroborated_spikes(graph, eager) == {512.0}
    curve = TABLES.allreduce(8, True)
    assert curve is not None
    assert min(graph[256.0], graph[1024.0]) <= curve(512.0) <= max(graph[256.0], graph[1024.0])


def test_a_protocol_step_both_measurements_show_is_kept() -> None:
    """The PCIe box's all-reduce is slower at 262,144 elements than at 524,288, in the graph table and the
    eager table alike: NCCL's low-latency protocol up to 512 KB, Simple above. A decode step of Kimi K2 at
    32 tokens (229,376 elements) runs below that switch, so it is priced on the low-latency segment."""
    tables = KernelTables("rtx_pro_6000_server", "0.5.23", LANES["sglang"])
    for graph in (True, False):
        points, other = tables.allreduce_points(8, graph), tables.allreduce_points(8, not graph)
        assert points[262144.0] > points[524288.0] > points[131072.0]
        assert 262144.0 not in uncorroborated_spikes(points, other)
        curve = tables.allreduce(8, graph)
        assert curve is not None
        assert points[131072.0] < curve(7168 * 32) < points[262144.0]
        assert curve(7168 * 32) > points[524288.0]  # not the lower envelope a monotone fit would give


def test_nearest_version_prefers_the_newest_not_newer() -> None:
    recorded = ["0.5.6.post2", "0.5.9", "0.5.10", "0.5.14"]
    assert nearest_version(recorded, "0.5.23") == "0.5.14"
    assert nearest_version(recorded, "0.5.12") == "0.5.10"
    assert nearest_version(recorded, "0.5.9") == "0.5.9"
    assert nearest_version(recorded, "0.4.6") == "0.5.6.post2"


# -- the source inside the simulator ----------------------------------------------------------------

def _cfg(model: str, hardware: str, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(["--model-path", str(REPO / "models" / model), "--sim-hardware", hardware, *extra])


def test_a_covered_model_is_priced_from_the_tables() -> None:
    cfg = _cfg("llama-3.1-70b", "h200-nvlink-x8", "--tp-size", "4")
    costs = cfg.step_costs
    assert costs.source == "measured" and "h200_sxm" in costs.tables and costs.fallbacks() == []
    assert cfg.server_info()["sim_step_costs"]["label"].startswith("measured (aiconfigurator-core")
    # the step is the sum of its operator families, and differs from the roofline's price
    shape = decode_shape([1024] * 8)
    families = cfg.cost.source.family_times(0, shape)
    assert cfg.cost.gpu_time(0, shape) == pytest.approx(sum(families.values()))
    assert families["dense_mlp"] > 0 and families["attention"] > 0 and families["moe"] == 0
    assert cfg.cost.gpu_time(0, shape) != cfg.cost.roofline_gpu_time(0, shape)
    # the graph and eager all-reduce tables both price it, the eager launch slower
    assert cfg.cost.source.comm_time(0, shape, False) > cfg.cost.source.comm_time(0, shape, True) > 0


def test_a_system_whose_tables_lack_a_column_is_priced_from_them() -> None:
    # A100's attention tables have no window_size column (every row full attention): the filter on it
    # is dropped, not raised (it stopped every A100 launch with a pyarrow error)
    cfg = _cfg("llama-3.1-70b", "a100-sxm-x8", "--tp-size", "8")
    assert cfg.step_costs.source == "measured" and "a100_sxm" in cfg.step_costs.tables
    families = cfg.cost.source.family_times(0, decode_shape([1024] * 8))
    assert families["attention"] > 0
    assert "attention" not in " ".join(str(f) for f in cfg.step_costs.fallbacks())


def test_an_uncovered_operator_falls_back_to_the_roofline_and_is_reported() -> None:
    # tiny-test's attention (4 heads, 2 KV heads of 64) and its 8-expert MoE were never measured
    cfg = _cfg("tiny-test", "h100-sxm-x8")
    fallbacks = cfg.step_costs.fallbacks()
    assert any(f.startswith("attention.generation: attention 4 heads / 2 KV heads of 64") for f in fallbacks)
    assert any(f.startswith("moe.experts: bfloat16 MoE 256x128 top-2 of 8") for f in fallbacks)
    assert cfg.server_info()["sim_step_costs"]["fallbacks"] == fallbacks
    # its attention is then the roofline's: reading the KV cache at eta_mem of the bandwidth
    src, spec = cfg.cost.source, cfg.spec
    shape = decode_shape([100_000])
    kv = 100_000 * 2 * spec.num_kv_heads * spec.qk_head_dim * spec.kv_bytes_per_elem
    attn = src._attention_time(shape)
    assert attn == pytest.approx(kv / (cfg.cost.p.eta_mem * cfg.hw.mem_bw_gbs * 1e9), rel=1e-9)
    # a shape beyond the measured widths (Kimi K2's 163,840-entry vocabulary on one GPU) too
    kimi = _cfg("kimi-k2", "rtx-pro-6000-pcie-x8", "--pp-size", "8")
    assert "lm_head: bfloat16 GEMM 163840x7168 not measured" in kimi.step_costs.fallbacks()


def test_a_query_outside_the_measured_range_is_reported_when_met() -> None:
    cfg = _cfg("llama-3.1-70b", "h200-nvlink-x8", "--tp-size", "4")
    assert cfg.step_costs.fallbacks() == []
    cfg.cost.gpu_time(0, decode_shape([1024] * 4096))  # a decode batch larger than any measured
    assert any(f.startswith("attention.generation: batch 4096 at length 1024 beyond the measured points")
               for f in cfg.step_costs.fallbacks())
    cfg.cost.gpu_time(0, prefill_shape([(40_000, 0)]))  # more rows than any measured GEMM
    expected = "mlp.down: 40000 rows above the largest measured (32768): in proportion"
    assert expected in cfg.step_costs.fallbacks()


def test_a_calibration_scale_multiplies_its_family(tmp_path: Path) -> None:
    profile = tmp_path / "scale.yaml"
    profile.write_text("name: s\nhardware: h200-nvlink-x8\n"
                       "params:\n  scale_gemm: {value: 2.0, source: test}\n")
    plain = _cfg("llama-3.1-70b", "h200-nvlink-x8", "--tp-size", "4")
    scaled = _cfg("llama-3.1-70b", "h200-nvlink-x8", "--tp-size", "4", "--sim-calibration", str(profile))
    shape = prefill_shape([(2048, 0)])
    a, b = plain.cost.source.family_times(0, shape), scaled.cost.source.family_times(0, shape)
    # GEMMs only: the activation between them is elementwise work, not scaled
    act = plain.cost.source._elementwise_time(2048, 1, 3 * plain.spec.dense_inter / 4) * plain.spec.num_layers
    assert b["dense_mlp"] - act == pytest.approx(2 * (a["dense_mlp"] - act))
    assert b["attention"] > a["attention"]  # its projections are GEMMs; the kernel is not scaled
    assert b["attention"] < 2 * a["attention"]


def test_the_roofline_stays_available() -> None:
    cfg = _cfg("llama-3.1-70b", "h200-nvlink-x8", "--tp-size", "4", "--sim-step-costs", "roofline")
    assert cfg.step_costs.label() == "roofline (asked for)" and cfg.cost.source is None
    shape = decode_shape([1024] * 8)
    assert cfg.cost.gpu_time(0, shape) == cfg.cost.roofline_gpu_time(0, shape)


def test_measured_without_tables_is_refused_and_auto_says_why(tmp_path: Path) -> None:
    hw = load_hardware("h100-sxm-x8")
    profile = tmp_path / "bare.yaml"
    profile.write_text("\n".join(f"{k}: {v}" for k, v in vars(hw).items()
                                 if k not in ("kernel_tables", "source")) + "\n")
    # the message the simulated server prints before it exits 1
    with pytest.raises(ValueError, match=r"--sim-step-costs measured: the hardware profile names no "
                                         r"kernel table set \(hardware.kernel_tables\); valid here: auto or "
                                         r"roofline"):
        _cfg("tiny-test", str(profile), "--sim-step-costs", "measured")
    auto = _cfg("tiny-test", str(profile))
    assert auto.step_costs.source == "roofline" and "names no kernel table set" in auto.step_costs.label()


def test_config_errors_name_the_key() -> None:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.workload.concurrency = [1]
    cfg.simulator.step_costs = "fast"
    with pytest.raises(ConfigError, match=r"^simulator.step_costs=fast: invalid; valid: auto, roofline, "
                                          r"measured$"):
        validate(cfg)
    cfg.simulator.step_costs, cfg.hardware.kernel_tables = "measured", None
    with pytest.raises(ConfigError, match=r"^simulator.step_costs=measured: invalid \(the hardware profile "
                                          r"names no kernel table set"):
        validate(cfg)
    cfg.hardware.kernel_tables = "h100_sxm"
    validate(cfg)


def test_a_qk_norm_over_all_heads_all_reduces_its_sums_under_tp() -> None:
    """MiniMax-M2 normalises q and k over all heads at once (its config: use_qk_norm, qk_norm_type
    per_layer): with the heads split over a TP group, every layer all-reduces each token's two sums of
    squares (FP32), a message below the table's smallest, priced at that smallest one's time. Its two
    kernels count in the attention blocks'. Qwen3 normalises head by head: nothing to all-reduce."""
    cfg = _cfg("minimax-m2.5", "h100-sxm-x8", "--tp-size", "4")
    cost = cfg.cost
    assert cfg.spec.qk_norm_over_heads
    measured = rows("comm", "custom_allreduce_perf", num_gpus=4, allreduce_dtype="bfloat16",
                    backend="sglang_graph")
    smallest = min(measured, key=lambda r: r["message_size"])
    assert smallest["message_size"] > 8 * 8 / 2  # 8 tokens' sums: 32 BF16 elements' worth
    one = cost.qk_norm_allreduce(8, True)
    assert one == pytest.approx(smallest["latency"] * 1e-3 + cost.allreduce_wait(), rel=1e-9)
    shape = decode_shape([1024] * 8)
    layers = cost.stages[0].layers
    assert cost.comm_time(0, shape) == pytest.approx(cost.source.comm_time(0, shape, True) + layers * one)
    p = cost.p
    assert cost.stages[0].attn_kernels == layers * (p.kernels_attn_gqa + QK_NORM_KERNELS
                                                    + p.kernels_tp_collective)
    qwen = _cfg("qwen3-32b", "h100-sxm-x8", "--tp-size", "4")
    assert not qwen.spec.qk_norm_over_heads and qwen.cost.qk_norm_allreduce(8, True) == 0.0
