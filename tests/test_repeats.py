"""``repeats=N``: every trial N times, each on a fresh simulated engine, recorded as N trials and read
back as one configuration whose numbers are judged by the repeats' spread."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from analysis.repeats import combine_repeats
from tests.conftest import NO_DRAWING, run_cli
from vocab.status import Tag

# one configuration, long enough requests that the client's turnaround is a small part of each
ONE = ["model=tiny-test", "hardware=h200-nvlink-x8", "parallelism=tp1", "workload=tiny", *NO_DRAWING,
       "workload.output_len=64", "ray.num_cpus=2", "engine=sim"]


@pytest.mark.slow
def test_repeats_run_each_trial_n_times_and_say_within_noise(tmp_path: Path) -> None:
    # two configurations that run the same engine (the seed of its sampling: every request is greedy
    # and fixed-length), three repeats each
    result = run_cli(["-m", *ONE, "repeats=3", "server.random_seed=0,1"], tmp_path, timeout=600,
                     env={"COLUMNS": "100"}, store=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "6 trial(s), status ok" in out
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = client.search_runs(["1"], f"tags.`{Tag.KIND}` = 'trial'")
    assert sorted(r.data.params["repeat"] for r in runs) == ["0", "0", "1", "1", "2", "2"]
    assert len({r.data.tags[Tag.CONFIG_HASH] for r in runs}) == 6  # each its own measurement
    assert len({r.data.tags[Tag.PARENT] for r in runs}) == 1
    # read back as two configurations: a row each per point, the median of its three
    combined = combine_repeats(runs)
    assert [r.data.tags[Tag.OVERRIDES] for r in combined] == ["server.random_seed=0 ×3",
                                                              "server.random_seed=1 ×3"]
    first = sorted((r for r in runs if r.data.params["server.random_seed"] == "0"),
                   key=lambda r: r.data.params["repeat"])
    tok = sorted(r.data.metrics["c4/output_tok_s"] for r in first)
    assert combined[0].data.metrics["c4/output_tok_s"] == tok[1]
    assert combined[0].data.metrics["c4/output_tok_s_ci95"] >= 0
    # the same engine twice: nothing is crowned, and the summary says so, unless a repeat's client fell
    # behind on a busy machine (the configuration's point is then not valid, and not compared at all)
    assert "#0 server.random_seed=0 ×3" in out and "×N = N repeats" in out
    table = out[out.index("point "):out.index("×N = N repeats")]
    assert "* best" not in out and not any(cell.endswith("*") for cell in table.split())
    c4 = table[table.index("\nc4 "):].split("\nc4:")[0]
    assert "c4: within noise, no trial marked: tok/s" in " ".join(out.split()) or "!" in c4
