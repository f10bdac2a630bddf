"""A box the roofline prices, with its TP all-reduce measured on another system of its GPU generation and
bus (``collective_tables``: the L4 profile reads aiconfigurator-core's L40S all-reduce). The expected
times are read here from the package's own parquet files, not through the simulator's table reader."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from packaging.version import Version

from simulator.kernel_tables import systems_dir
from simulator.predict import load_config
from simulator.vllm.releases import NEWEST

pytestmark = pytest.mark.skipif(systems_dir() is None, reason="aiconfigurator-core is not installed here")

MODEL = "models/llama-3.1-8b"  # hidden 4096: 256 tokens are an all-reduce of 1,048,576 elements


def _measured_ms(engine: str, launched: str, gpus: int, backend: str, elems: int) -> float:
    """The L40S table's latency (ms) of ``elems`` bf16 elements, at the engine's newest recorded version
    not newer than ``launched``."""
    base = Path(systems_dir()) / "data" / "l40s" / "comm" / engine  # type: ignore[arg-type]
    versions = sorted((d.name for d in base.iterdir() if (d / "custom_allreduce_perf.parquet").is_file()),
                      key=Version)
    version = [v for v in versions if Version(v) <= Version(launched)][-1]
    rows = pq.read_table(base / version / "custom_allreduce_perf.parquet").to_pylist()
    hits = [r["latency"] for r in rows if r["num_gpus"] == gpus and r["backend"] == backend
            and r["message_size"] == elems and r["allreduce_dtype"] == "bfloat16"]
    assert len(hits) == 1, (engine, version, gpus, backend, elems)
    return float(hits[0])


def _vllm(*flags: str):  # type: ignore[no-untyped-def]
    return load_config(["serve", MODEL, "--sim-hardware", "l4-pcie-x8", *flags])


def test_four_l4s_all_reduce_as_the_l40s_server_measured_it_eagerly() -> None:
    cfg = _vllm("-tp", "4", "--enforce-eager")
    expected = _measured_ms("vllm", NEWEST, 4, "vllm_eager", 1_048_576) * 1e-3 + cfg.cost.allreduce_wait()
    assert cfg.cost.collective_time(256, graph=False) == pytest.approx(expected, rel=1e-9)
    # among four GPUs NCCL's all-reduce is several times two GPUs' custom one: what the pair of
    # layouts on eight L4s turns on
    two = _vllm("-tp", "2", "--enforce-eager")
    assert cfg.cost.collective_time(256, graph=False) > 5 * two.cost.collective_time(256, graph=False)


def test_the_graph_lane_and_sglang_s_own_table() -> None:
    cfg = load_config(["--model-path", MODEL, "--sim-hardware", "l4-pcie-x8", "--tp-size", "2"])
    from simulator import SGLANG_COMPAT_VERSION

    expected = (_measured_ms("sglang", SGLANG_COMPAT_VERSION, 2, "sglang_graph", 1_048_576) * 1e-3
                + cfg.cost.allreduce_wait())
    assert cfg.cost.collective_time(256, graph=True) == pytest.approx(expected, rel=1e-9)


def test_outside_the_table_the_smallest_time_below_and_bandwidth_above() -> None:
    cost = _vllm("-tp", "4", "--enforce-eager").cost
    tiny = cost.message_allreduce_time(2.0, graph=False)  # one element: below the smallest measured
    smallest = cost.message_allreduce_time(128 * 2.0, graph=False)
    assert tiny == pytest.approx(smallest)
    largest = 536_870_912 * 2.0  # bytes of the table's largest message
    assert cost.message_allreduce_time(2 * largest, graph=False) == pytest.approx(
        2 * cost.message_allreduce_time(largest, graph=False) - cost.allreduce_wait(), rel=1e-9)


def test_the_label_says_what_measured_the_all_reduce_and_roofline_asked_for_keeps_the_formula() -> None:
    cfg = _vllm("-tp", "4", "--enforce-eager")
    label = cfg.step_costs.label()
    assert label.startswith("roofline (") and "TP all-reduce measured (aiconfigurator-core" in label
    assert "l40s, vLLM " in label
    plain = _vllm("-tp", "4", "--enforce-eager", "--sim-step-costs", "roofline")
    assert "all-reduce" not in plain.step_costs.label()
    hw = plain.cost.hw
    formula = (hw.allreduce_latency_us * 1e-6 + 1.5 * 1_048_576 * 2 / plain.cost._link
               + plain.cost.allreduce_wait())
    assert plain.cost.collective_time(256, graph=False) == pytest.approx(formula, rel=1e-9)
    assert plain.cost.collective_time(256, graph=False) < cfg.cost.collective_time(256, graph=False) / 3
