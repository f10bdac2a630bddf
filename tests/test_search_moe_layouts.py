"""The search preset for DeepSeek-R1 on one 8xH200 node (1,000 tokens in and out, mean TPOT under 50 ms),
run through ``run.py``: TP8, its experts spread (EP8), eight attention-DP ranks with and without DeepEP
are each predicted and ranked side by side; disaggregated pairs of four-GPU servers, and attention DP
wider than a TP group, are screened out, each with its reason."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import NO_DRAWING, run_cli

pytestmark = pytest.mark.slow


def test_tp_ep_and_attention_dp_are_ranked_side_by_side(tmp_path: Path) -> None:
    # a shorter budget and load cap than the preset's keep the test short; the ranking's shape holds
    result = run_cli(["experiment=search-deepseek-r1-h200", *NO_DRAWING, "workload.predicted.budget_s=120",
                      "search.max_concurrency=256"], tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    table = pd.read_csv(next(tmp_path.glob("runs/outputs/**/search/candidates.csv")))
    judged = table[table["status"] == "ok"]
    layouts = {(r["ep.size"], r["dp.attention"], r["ep.a2a_backend"]) for _, r in judged.iterrows()}
    assert {(1, 1, "none"), (8, 1, "none"), (8, 8, "none"), (8, 8, "deepep")} <= layouts
    assert (judged["tp.size"] == 8).all() and (judged["pd"] == "none").all()
    assert judged["score"].notna().all() and (judged["concurrency"] > 0).all()
    rejected = table[table["status"] == "rejected"]
    pairs = rejected[rejected["pd"] == "1p1d-tp4"]
    assert len(pairs) == 16  # every disaggregated candidate, each with why
    assert pairs["reason"].str.contains("Not enough memory|divisor of").all()
    wide = rejected[(rejected["tp.size"] == 4) & (rejected["dp.attention"] == 8) & (rejected["pd"] == "none")]
    assert wide["reason"].str.contains("dp.attention").all() and len(wide) == 4
    summary = " ".join(result.stdout.split())
    assert "Best: tp.size=8" in summary and "Runner-up: tp.size=8" in summary
    assert "predicted by the simulated engine in virtual time, not measured" in summary
