"""The disaggregated served runs of aiconfigurator-core's ``systems/silicon_sample.csv`` (the installed
file itself), mapped to deployments the way they ran, replayed, and estimated by AIConfigurator's
disaggregated path."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.fidelity.replay import plan
from orchestrator.fidelity.served import aic_estimate, predict_row
from orchestrator.fidelity.silicon import SiliconError, Unreplayable, default_csv
from orchestrator.fidelity.silicon_disagg import DENSE_TP1, RECIPES, read_disagg, to_entry

ROOT = Path(__file__).resolve().parents[1]
H200_C128 = "dsr1_h200_sglang_fp8_disagg_8192x1024_c128_cfg434"
B200_FP4_C2048 = "dsr1_b200_sglang_fp4_disagg_8192x1024_c2048_cfg538"
B200_C4 = "dsr1_b200_sglang_fp8_disagg_1024x1024_c4_cfg455"


@pytest.fixture(scope="module")
def disagg():
    return read_disagg(default_csv())


def _row(rows, ident):
    return next(r for r in rows if r.id == ident)


def test_only_rows_with_their_topology_are_read(disagg) -> None:
    rows, clean = disagg
    df = pd.read_csv(default_csv())
    sglang = df[(df["backend"] == "sglang") & (df["mode"] == "disagg")]
    assert clean.rows == len(sglang)
    assert clean.without_topology == int(sglang["decode_num_workers"].isna().sum()) > 0
    assert clean.distinct == len(rows) == clean.rows - clean.without_topology - clean.duplicates
    # the stream count rebuilt from the decode batch, servers and ranks is the one the source recorded
    checked = 0
    for r in rows:
        m = re.search(r"silicon_concurrency=(\d+)", r.source)
        if m:
            assert r.concurrency == int(m.group(1)), r.id
            checked += 1
    assert checked > 50


def test_a_decode_server_of_attention_dp_ranks_runs_as_its_recipe_launched_it(disagg, tmp_path: Path) -> None:
    row = _row(disagg[0], H200_C128)
    # AIConfigurator's "tp 1, attention_dp 8" is one server of eight GPUs, eight ranks
    assert (row.decode.gpus, row.decode.attention, row.decode.ep, row.decode.workers) == (8, 8, 8, 1)
    assert (row.prefill.gpus, row.prefill.attention, row.prefill.workers) == (8, 1, 1)
    entry, notes = to_entry(row)
    assert (entry.gpu_count, entry.nodes) == (16, 2)
    assert entry.workload.max_concurrency == 128 and entry.workload.num_prompts == 1280
    assert any("bs128-1p1d-dep.yaml" in n for n in notes)
    roles = plan(entry, tmp_path).roles
    assert roles is not None
    decode, prefill = roles.decode_argv, roles.prefill_argv
    assert decode[decode.index("--attn-dp-size") + 1] == "8"
    assert decode[decode.index("--mem-fraction-static") + 1] == "0.88"
    assert prefill[prefill.index("--chunked-prefill-size") + 1] == "163840"
    assert all("--disable-radix-cache" in a and a[a.index("--disaggregation-transfer-backend") + 1] == "nixl"
               for a in (decode, prefill))


def test_many_servers_of_a_role_are_placed_on_their_nodes(disagg, tmp_path: Path) -> None:
    row = _row(disagg[0], B200_FP4_C2048)
    assert (row.prefill.workers, row.prefill.gpus, row.prefill.attention) == (7, 4, 4)
    assert (row.decode.workers, row.decode.gpus, row.decode.attention) == (2, 8, 8)
    entry, notes = to_entry(row)
    # two prefill servers of four GPUs share a node: seven take four nodes, each decode server one more
    assert (entry.gpu_count, entry.nodes) == (44, 6)
    assert DENSE_TP1 in notes  # what the recipe sets and the engine does not model, said
    roles = plan(entry, tmp_path).roles
    assert roles is not None and (roles.prefill_workers, roles.decode_workers) == (7, 2)
    assert roles.decode_argv[roles.decode_argv.index("--max-running-requests") + 1] == "2048"


def test_every_inferencex_row_on_a_profiled_gpu_has_its_recipe(disagg) -> None:
    rows, _ = disagg
    profiled = [r for r in rows if r.system in ("h100_sxm", "h200_sxm", "b200_sxm")]
    inferencex = [r for r in profiled if r.cohort == "inferencex"]
    assert inferencex and all(r.config_id in RECIPES for r in inferencex)
    for r in profiled:
        to_entry(r)  # raises for a row it cannot map
    gb = next(r for r in rows if r.system.startswith("gb"))
    with pytest.raises(Unreplayable, match="no hardware profile"):
        to_entry(gb)


def test_a_gap_analysis_row_keeps_sglangs_defaults_and_fixed_lengths(disagg) -> None:
    rows, _ = disagg
    row = next(r for r in rows if r.cohort == "gap-analysis" and r.system == "h100_sxm")
    entry, notes = to_entry(row)
    assert entry.workload.random_range_ratio == 1.0
    assert entry.server_args == {"quantization": "fp8"}  # the FP8 checkpoint, quantized at load
    assert entry.disaggregation is not None
    assert entry.disaggregation.decode.server_args == {"disable_radix_cache": True}
    assert any("launch not published" in n for n in notes)


def test_aiconfigurators_estimate_sees_no_queue(disagg) -> None:
    rows, _ = disagg
    h200 = sorted((r for r in rows if r.id.startswith("dsr1_h200_sglang_fp8_disagg_8192x1024_c")),
                  key=lambda r: r.concurrency)
    estimates = [aic_estimate(r) for r in h200]
    assert all(e.ttft_ms and e.tpot_ms for e in estimates), [e.why_none for e in estimates]
    # its TTFT is one prompt's prefill whatever the load; its TPOT follows the decode batch
    assert len({e.ttft_ms for e in estimates}) == 1
    tpots = [e.tpot_ms for e in estimates]
    assert tpots == sorted(tpots) and tpots[-1] > 1.3 * tpots[0]
    # the measured TTFT grows with the queue at the one prefill server
    assert h200[-1].ttft_ms > 10 * h200[0].ttft_ms
    big = next(r for r in rows if r.cohort == "gap-analysis" and r.decode.gpus == 1)
    none = aic_estimate(big)
    assert none.ttft_ms is None and "out of memory" in none.why_none and "\n" not in none.why_none


def test_a_disaggregated_row_is_replayed(disagg) -> None:
    kind, served = predict_row(_row(disagg[0], B200_C4), with_aic=False)
    assert kind == "ok", served
    assert served.layout == "disaggregated" and served.group == "DeepSeek-R1 on b200_sxm"  # type: ignore[attr-defined]
    assert 0 < served.parasweep["tpot_ms"] < served.parasweep["ttft_ms"]  # type: ignore[attr-defined]
    assert served.family == "DeepSeek-R1 P TP8 EP8 x1 / D TP8 EP8 x1 fp8 on b200_sxm"  # type: ignore[attr-defined]
    # the mean request time of InferenceX's client: TTFT + (0.9 x 1,024 - 1) x TPOT, measured and predicted
    time = {who: x["ttft_ms"] + (0.9 * 1024 - 1) * x["tpot_ms"]
            for who, x in (("measured", served.measured), ("parasweep", served.parasweep))}  # type: ignore[attr-defined]
    assert served.request_error("parasweep") == pytest.approx(time["parasweep"] / time["measured"] - 1)  # type: ignore[attr-defined]
    assert served.request_error("aiconfigurator") is None  # not asked


def test_a_file_without_the_role_columns_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "mine.csv"
    bad.write_text("id,backend,mode\nx,sglang,disagg\n")
    with pytest.raises(SiliconError, match="missing column") as e:
        read_disagg(bad)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_scores_the_disaggregated_rows_apart(tmp_path: Path) -> None:
    out = tmp_path / "silicon.json"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "fidelity", "--silicon", "--workers", "1", "--only", B200_C4,
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Disaggregated runs" in proc.stdout and "out of sample" in proc.stdout
    assert "mean request time (throughput)" in proc.stdout
    data = json.loads(out.read_text())
    assert "compared" not in data  # no aggregated row matched
    row = data["disaggregated"]["compared"][0]
    assert row["id"] == B200_C4 and row["group"] == "DeepSeek-R1 on b200_sxm"
    assert row["aiconfigurator"]["tpot_ms"] > 0 and row["error"]["parasweep"]["tpot_ms"] is not None
    groups = {s["label"] for s in data["disaggregated"]["summary"]["group"]}
    assert groups == {"DeepSeek-R1 on b200_sxm", "all"}
