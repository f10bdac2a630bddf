"""The served SGLang runs aiconfigurator-core ships (its systems/silicon_sample.csv, read as installed):
cleaned as documented, mapped to a launch and a client, replayed in virtual time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.fidelity.replay import plan
from orchestrator.fidelity.served import APART, predict_row, side_by_side
from orchestrator.fidelity.silicon import (
    SLOWER_BEYOND,
    SiliconError,
    Unreplayable,
    default_csv,
    no_faster,
    read_silicon,
    slower_than_a_lesser_gpu,
    to_entry,
    warmed_up,
)

ROOT = Path(__file__).resolve().parents[1]
H200_C16 = "dsr1_h200_sglang_fp8_agg_1024x1024_c16_cfg81"  # InferenceX config 81, SGLang 0.5.9


@pytest.fixture(scope="module")
def silicon():
    return read_silicon(default_csv())


def _row(rows, ident):
    return next(r for r in rows if r.id == ident or ident in r.duplicates)


def test_cleaning_counts_what_it_did(silicon) -> None:
    rows, clean = silicon
    assert clean.backend_rows == 1487
    assert clean.disaggregated == 534
    assert len(clean.mislabelled) == 20  # the GB200 TP72 rows
    assert clean.relabelled == 172
    assert clean.distinct == len(rows) == clean.backend_rows - clean.disaggregated - 20 - clean.duplicates
    assert not any(r.system == "gb200" for r in rows)
    # every kept row is one measurement: no two share lengths, concurrency and both numbers
    keys = {(r.system, r.group, r.precision, r.isl, r.osl, r.concurrency, round(r.ttft_ms, 3),
             round(r.tpot_ms, 3)) for r in rows}
    assert len(keys) == len(rows)


def test_legacy_tp_times_ep_rows_get_their_real_layout(silicon) -> None:
    rows, _ = silicon
    # exported as tp_size 64 / moe_tp 8 / moe_ep 8: SGLang ran --tp 8 --ep-size 8 on eight GPUs
    r = _row(rows, "dsr1_b200_sglang_fp8_agg_1024x8192_c4_cfg199")
    assert (r.tp, r.ep) == (8, 8)
    assert r.columns["tp_size"] == 64  # what AIConfigurator's tool is given, unchanged
    assert "--tp 8 --ep-size 8" in r.fixes[0]


def test_the_same_measurement_exported_twice_is_one_row(silicon) -> None:
    rows, _ = silicon
    r = _row(rows, H200_C16)
    assert r.id == H200_C16  # the export naming its InferenceX config is the one kept
    assert "2026_04_06_deepseek_r1_h200_sxm_sglang_fp8_agg_1024x1024_c16_tp8_ep1_238" in r.duplicates
    assert (r.ttft_ms, r.tpot_ms) == pytest.approx((285.876, 16.630), abs=1e-3)


def test_unmodelled_rows_say_why(silicon) -> None:
    rows, _ = silicon
    qwen35 = next(r for r in rows if "Qwen3.5" in r.model)
    glm = next(r for r in rows if "GLM-5" in r.model)
    for row, words in ((qwen35, "linear-attention"), (glm, "sparse attention")):
        with pytest.raises(Unreplayable, match=words):
            to_entry(row)


def test_inferencex_launch_and_client(silicon, tmp_path: Path) -> None:
    rows, _ = silicon
    entry, _ = to_entry(_row(rows, H200_C16))
    p = plan(entry, tmp_path)
    argv = " ".join(p.argv)
    for flag in ("--max-running-requests 512", "--cuda-graph-max-bs 512", "--chunked-prefill-size 32768",
                 "--mem-fraction-static 0.82", "--disable-radix-cache", "--tp-size 8"):
        assert flag in argv
    assert "--kv-cache-dtype" not in argv  # the H200 script leaves the KV cache in BF16
    # closed loop of 16 streams, 10 x 16 requests, lengths uniform in [floor(0.8 L), L], all sent at once
    assert p.max_concurrency == 16 and len(p.requests) == 160
    assert all(819 <= r.input_len <= 1024 and 819 <= r.output_len <= 1024 for r in p.requests)
    assert {r.offset_s for r in p.requests} == {0.0}
    b200 = next(r for r in rows if r.system == "b200_sxm" and r.precision == "fp8" and r.tp == 8
                and r.version == "0.5.9" and "DeepSeek" in r.model)
    argv = " ".join(plan(to_entry(b200)[0], tmp_path).argv)
    assert "--kv-cache-dtype fp8_e4m3" in argv and "--max-running-requests 128" in argv


def test_nvfp4_rows_run_nvidias_checkpoint_on_its_own_kernels(silicon, tmp_path: Path) -> None:
    rows, _ = silicon
    fp4 = next(r for r in rows if r.precision == "fp4" and "DeepSeek" in r.model and r.system == "b200_sxm")
    entry, _ = to_entry(fp4)
    argv = " ".join(plan(entry, tmp_path).argv)
    assert "deepseek-r1-nvfp4" in argv and "--kv-cache-dtype fp8_e4m3" in argv
    from simulator.predict import load_config

    cfg = load_config(plan(entry, tmp_path).argv)
    assert cfg.spec.nvfp4 and cfg.spec.expert_bytes_per_param == 0.5625
    assert cfg.spec.attn_bytes_per_param == 2.0  # the recipe keeps the attention's projections in BF16
    assert cfg.cost.source is not None and cfg.cost.source.coverage.priced["moe.experts"] == "measured"


def test_llama_fp8_rows_quantize_the_checkpoint_at_load(silicon, tmp_path: Path) -> None:
    rows, _ = silicon
    llama = next(r for r in rows if "Llama-3.1-8B" in r.model)
    entry, notes = to_entry(llama)
    assert "--quantization fp8" in " ".join(plan(entry, tmp_path).argv)
    assert any("quantized to FP8 at load" in n for n in notes)
    assert any("client not published" in n for n in notes)


def test_gap_batches_keep_or_vary_their_lengths_as_their_numbers_show(silicon, tmp_path: Path) -> None:
    rows, _ = silicon
    # the H100 batch shows the waves of fixed lengths; the H200 batch's TTFTs rule them out
    qwen = next(r for r in rows if "Qwen3-32B" in r.model and r.system == "h100_sxm")
    llama = next(r for r in rows if "Llama-3.1-8B" in r.model and r.concurrency >= 64)
    fixed = plan(to_entry(qwen)[0], tmp_path).requests
    assert {(r.input_len, r.output_len) for r in fixed} == {(qwen.isl, qwen.osl)}
    entry, notes = to_entry(llama)
    varied = plan(entry, tmp_path).requests
    assert len({r.input_len for r in varied}) > 1 and len({r.output_len for r in varied}) > 1
    assert all(int(0.8 * llama.isl) <= r.input_len <= llama.isl for r in varied)
    assert any("rule out fixed lengths" in n for n in notes)


def test_rows_beyond_the_scripts_cap_ran_with_another_launch(silicon, tmp_path: Path) -> None:
    rows, _ = silicon
    c512 = next(r for r in rows if r.system == "b200_sxm" and r.precision == "fp8" and r.tp == 8
                and r.concurrency == 512 and r.cohort == "inferencex")
    entry, notes = to_entry(c512)
    argv = " ".join(plan(entry, tmp_path).argv)
    assert "--max-running-requests 512" in argv and "--cuda-graph-max-bs 512" in argv
    assert any("over the script's --max-running-requests 128" in n for n in notes)


def test_rows_measured_without_warm_up_are_scored_apart(silicon) -> None:
    rows, clean = silicon
    # InferenceX's client sent no warm-up before 2026-01-21: the November NVFP4 rows
    cold = [r for r in rows if not warmed_up(r)]
    assert cold and all(r.cohort == "inferencex" and r.version == "" for r in cold if r.precision == "fp4")
    assert all("without warm-up" in r.apart for r in cold)
    warm = next(r for r in rows if r.id == H200_C16)
    assert warmed_up(warm) and not warm.apart
    assert clean.apart == sum(1 for r in rows if r.apart) > len(cold)
    got = [predict_row(r, with_aic=False)[1] for r in (cold[0], warm)]
    assert [bool(s.apart) for s in got] == [True, False]  # type: ignore[attr-defined]
    sides = side_by_side(got, lambda s: s.system)  # type: ignore[arg-type]
    labels = {(s.label, s.metric): s.rows for s in sides}
    assert labels[("all", "ttft_ms")] == 1 and labels[(APART["measured without warm-up"], "ttft_ms")] == 1
    assert cold[0].system != warm.system and (cold[0].system, "ttft_ms") not in labels  # not among its GPU's


def test_a_row_far_slower_than_on_a_lesser_gpu_is_scored_apart(silicon) -> None:
    rows, _ = silicon
    # the B300's figures are those of the B200 or higher (HBM 3 % lower): no hardware reason to be slower
    assert no_faster("b200_sxm", "b300_sxm") and not no_faster("b200_sxm", "h200_sxm")
    b300 = [r for r in rows if r.system == "b300_sxm"]
    slow = [r for r in b300 if "slower than" in r.apart]
    assert slow and all("b200_sxm" in r.apart for r in slow)
    # the same script on B200, 8k prompts at 4 streams: 0.3 s of TTFT there, 1.4 s on the B300
    r = next(r for r in b300 if (r.precision, r.tp, r.ep, r.isl, r.concurrency) == ("fp4", 4, 4, 8192, 4))
    twin = next(t for t in rows if t.system == "b200_sxm" and (t.model, t.precision, t.tp, t.ep, t.isl, t.osl,
                t.concurrency) == (r.model, r.precision, r.tp, r.ep, r.isl, r.osl, r.concurrency))
    assert r.ttft_ms > SLOWER_BEYOND * twin.ttft_ms and "slower than" in r.apart
    assert "scored apart" in " ".join(to_entry(r)[1])
    # a B300 row within the spread of its twin is scored with the others
    near = [r for r in b300 if not r.apart]
    assert near and all(not slower_than_a_lesser_gpu(r, rows) for r in near)
    # H200 rows run another script (no receive interval): never twins of the B200's
    assert not any("h200_sxm" in r.apart for r in rows if r.system == "b200_sxm")


def test_replayed_latencies_follow_the_load(silicon) -> None:
    rows, _ = silicon
    h200 = [r for r in rows if r.id.startswith("dsr1_h200_sglang_fp8_agg_1024x1024_c")]
    by_c = {r.concurrency: r for r in h200}
    got = {c: predict_row(by_c[c], with_aic=False) for c in (4, 64)}
    assert all(kind == "ok" for kind, _ in got.values())
    low, high = got[4][1], got[64][1]
    # more streams: a larger decode batch (slower steps) and more prefills queued ahead of each request
    assert high.parasweep["tpot_ms"] > 1.3 * low.parasweep["tpot_ms"]  # type: ignore[attr-defined]
    assert high.parasweep["ttft_ms"] > low.parasweep["ttft_ms"]  # type: ignore[attr-defined]
    assert low.measured == {"ttft_ms": by_c[4].ttft_ms, "tpot_ms": by_c[4].tpot_ms}  # type: ignore[attr-defined]


def test_a_file_without_the_columns_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "mine.csv"
    bad.write_text("id,backend\nx,sglang\n")
    with pytest.raises(SiliconError, match="missing column") as e:
        read_silicon(bad)
    assert "\n" not in str(e.value)


def test_cli_writes_the_rows_and_says_what_is_not_replayed(tmp_path: Path) -> None:
    out = tmp_path / "silicon.json"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "fidelity", "--silicon", "--no-aiconfigurator",
         "--workers", "1", "--only", "dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81",
         "--only", "2026_03_25_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x8192_c64",
         "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "not replayed:" in proc.stdout and "linear-attention" in proc.stdout
    data = json.loads(out.read_text())
    row = next(r for r in data["compared"] if r["id"] == "dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81")
    assert row["family"] == "DeepSeek-R1 TP8 fp8 on h200_sxm" and row["group"] == "DeepSeek-R1 on h200_sxm"
    assert row["parasweep"]["tpot_ms"] > 0 and row["error"]["parasweep"]["tpot_ms"] is not None
    assert data["skipped"] and all(s["reason"] for s in data["skipped"])
    bad = subprocess.run([sys.executable, "-m", "orchestrator", "fidelity", "--silicon",
                          str(tmp_path / "no.csv")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--silicon" in bad.stderr
