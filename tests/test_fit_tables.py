"""Fitting the cost model's constants to operator tables (simulator/fit_tables.py), closed loop: tables
generated from the roofline with known constants are fitted back; held-out rows never move the fit;
bad input gives one line; the shipped profile is what the shipped tables give."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from simulator.calibration import load_calibration
from simulator.fit_tables import (
    DEFAULT_TABLES_DIR,
    GEMM_OPS,
    OTHER_OPS,
    VIDUR_MODELS,
    TableError,
    fidelity_markdown,
    fit_tables,
    layer_gemms,
)
from simulator.model_spec import load_model_spec
from vocab.assets import conf_dir, models_dir

H100_BW, H100_PEAK, H100_LINK = 3350e9, 989e12, 450e9  # conf/hardware/h100-sxm-x8.yaml
TRUE = {"eta_mem": 0.82, "eta_compute": 0.71, "kernel_floor_us": 4.5}
TRUE_AR = {"allreduce_latency_us": 21.0, "eta_link": 0.83}
TOKENS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096]
FIT, HELD = ["llama-2-7b", "llama-2-70b"], ["codellama-34b"]


def projection_params(cfg: dict) -> dict[str, int]:
    """Weights of each projection, straight from config.json (independent of the module's accounting)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, hd, inter = cfg.get("num_key_value_heads", heads), h // heads, cfg["intermediate_size"]
    return {"attn_pre_proj": h * (heads + 2 * kv) * hd, "attn_post_proj": heads * hd * h,
            "mlp_up_proj": 2 * h * inter, "mlp_down_proj": inter * h}


def synthetic_table(model: str, scale: float = 1.0) -> pd.DataFrame:
    cfg = json.loads((models_dir() / model / "config.json").read_text())
    params = projection_params(cfg)
    rows = []
    for tp in (1, 2, 4, 8):
        for n in TOKENS:
            row = {"num_tokens": n, "num_tensor_parallel_workers": tp, "n_head": cfg["num_attention_heads"],
                   "n_kv_head": cfg["num_key_value_heads"], "n_embd": cfg["hidden_size"],
                   "n_expanded_embd": cfg["intermediate_size"]}
            for op, p in params.items():
                t = max(2.0 * p / tp / (TRUE["eta_mem"] * H100_BW),
                        2.0 * n * p / tp / (TRUE["eta_compute"] * H100_PEAK), TRUE["kernel_floor_us"] * 1e-6)
                row[f"time_stats.{op}.median"] = t * 1e3 * scale
            for op in OTHER_OPS:
                row[f"time_stats.{op}.median"] = 0.002 + 1e-6 * n
            rows.append(row)
    return pd.DataFrame(rows)


def write_tables(root: Path, held_scale: float = 1.0) -> Path:
    for model in FIT + HELD:
        path = root / "compute" / "h100" / VIDUR_MODELS[model] / "mlp.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic_table(model, held_scale if model in HELD else 1.0).to_csv(path, index=False)
    rows = []
    for w in (2, 4, 8):
        for k in range(11, 27):
            size = 2**k
            bus = 2 * (w - 1) / w * size / (TRUE_AR["eta_link"] * H100_LINK)
            t = TRUE_AR["allreduce_latency_us"] * 1e-6 + bus
            rows.append({"num_workers": w, "size": size, "time_stats.all_reduce.median": t * 1e3})
    path = root / "network" / "h100_dgx" / "all_reduce.csv"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return root


def fitted(fit) -> dict[str, float]:
    cal = fit.calibration
    return {k: v["value"] for k, v in {**cal.params, **cal.hardware_overrides}.items()}


def test_fit_recovers_the_constants_that_made_the_tables(tmp_path: Path) -> None:
    fit = fit_tables(write_tables(tmp_path), "h100-sxm-x8", FIT, HELD)
    got = fitted(fit)
    for key, want in {**TRUE, **TRUE_AR}.items():
        assert math.isclose(got[key], want, rel_tol=0.01), (key, got[key], want)
    after = {(e.model, e.split): e.mape_after for e in fit.errors}
    assert after[("all", "held-out")] < 1.0 and after[("all", "fit")] < 1.0
    # the default constants are not the true ones, so "before" must be visibly worse
    assert min(e.mape_before for e in fit.errors) > 5.0


def test_held_out_rows_never_enter_the_fit(tmp_path: Path) -> None:
    base = fit_tables(write_tables(tmp_path / "a"), "h100-sxm-x8", FIT, HELD)
    moved = fit_tables(write_tables(tmp_path / "b", held_scale=3.0), "h100-sxm-x8", FIT, HELD)
    assert fitted(moved) == fitted(base)
    held = {(e.model, e.split): e.mape_after for e in moved.errors}
    assert held[("codellama-34b", "held-out")] > 50.0  # the tripled times are reported, not fitted
    assert {p.split for p in moved.points if p.model == "codellama-34b"} == {"held-out"}


def test_projection_bytes_are_the_cost_models_layer_bytes() -> None:
    spec = load_model_spec(str(models_dir() / "llama-2-70b"))
    ops = layer_gemms(spec, tokens=1, tp=4)
    assert [o.op for o in ops] == list(GEMM_OPS)
    assert math.isclose(sum(o.bytes for o in ops), spec.layer_nonexpert_bytes(0) / 4)
    assert math.isclose(sum(o.flops for o in ops), 2.0 * spec.layer_nonexpert_params(0) / 4)


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bad_input_gives_one_line(tmp_path: Path) -> None:
    tables = write_tables(tmp_path / "t")
    with pytest.raises(TableError) as e:
        fit_tables(tmp_path / "nowhere", "h100-sxm-x8", FIT, HELD)
    assert "nowhere" in one_line(e)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", ["gpt-5"], [])
    assert "gpt-5" in one_line(e) and "llama-2-7b" in one_line(e)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, ["qwen-72b"])  # config exists, table does not
    assert "Qwen-72B/mlp.csv" in one_line(e)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, HELD, models_dir=tmp_path / "no-models")
    assert "llama-2-7b" in one_line(e) and "config" in one_line(e)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "rtx-pro-6000-pcie-x8", FIT, HELD)
    assert "rtx-pro-6000-pcie-x8" in one_line(e)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, ["llama-2-7b"])
    assert "both" in one_line(e)
    empty = tables / "compute" / "h100" / VIDUR_MODELS["llama-2-7b"] / "mlp.csv"
    empty.write_text(empty.read_text().splitlines()[0] + "\n")
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, HELD)
    assert "no rows" in one_line(e)
    empty.write_text("")
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, HELD)
    assert "mlp.csv" in one_line(e)


def test_table_and_config_must_describe_the_same_model(tmp_path: Path) -> None:
    tables = write_tables(tmp_path)
    path = tables / "compute" / "h100" / VIDUR_MODELS["llama-2-70b"] / "mlp.csv"
    df = pd.read_csv(path)
    df["n_kv_head"] = 64
    df.to_csv(path, index=False)
    with pytest.raises(TableError) as e:
        fit_tables(tables, "h100-sxm-x8", FIT, HELD)
    assert "n_kv_head" in one_line(e) and "llama-2-70b" in one_line(e)


SHIPPED_FIT = ["llama-2-7b", "llama-2-70b"]
SHIPPED_HELD = ["codellama-34b", "internlm-20b", "qwen-72b"]


def test_shipped_profile_loads_has_sources_and_matches_the_shipped_tables() -> None:
    cal = load_calibration(conf_dir() / "calibration" / "h100-sxm-x8-vidur.yaml")
    assert cal.hardware == "h100-sxm-x8"
    entries = {**cal.params, **cal.hardware_overrides}
    assert {"eta_mem", "eta_compute", "kernel_floor_us", "eta_link", "allreduce_latency_us"} <= set(entries)
    for key, entry in entries.items():
        assert "microsoft/vidur@" in entry["source"], key
    # A stale profile (tables, configs or fit changed without rebuilding it: docs/calibration.md) fails here.
    fresh = fitted(fit_tables(DEFAULT_TABLES_DIR, "h100-sxm-x8", SHIPPED_FIT, SHIPPED_HELD, name=cal.name))
    for key, entry in entries.items():
        assert math.isclose(fresh[key], entry["value"], rel_tol=1e-3), (key, fresh[key], entry["value"])


def test_fidelity_report_names_every_model_and_set(tmp_path: Path) -> None:
    text = fidelity_markdown(fit_tables(write_tables(tmp_path), "h100-sxm-x8", FIT, HELD))
    for word in (*FIT, *HELD, "held-out", "8 GPUs", "`kernel_floor_us`", *GEMM_OPS):
        assert word in text, word
