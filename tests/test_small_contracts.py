"""Small contracts shared across layers: loosely typed values read as numbers, the MLflow experiment
kind that makes the UI open parasweep's runs in its model-training view, and plots that keep matplotlib's
layout warnings off the user's terminal."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import matplotlib.pyplot as plt

from analysis.plots import tight_layout
from orchestrator.store.tracking import ensure_experiment, mlflow_client
from tests.conftest import sqlite_store
from vocab.status import EXPERIMENT_KIND, Tag
from vocab.values import float_or_none, int_or_none


def test_values_read_as_numbers_or_none() -> None:
    assert [int_or_none(v) for v in (8, "8", None, "null", "x", 2.9)] == [8, 8, None, None, None, 2]
    assert [float_or_none(v) for v in ("0.5", 1, None, "nan", math.inf, "x")] == [0.5, 1.0, None, None,
                                                                                 None, None]


def test_experiments_open_in_the_model_training_view(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlflow.db")
    client = mlflow_client(uri)
    made = client.get_experiment(ensure_experiment(uri, "fresh"))
    assert made.tags[Tag.EXPERIMENT_KIND] == EXPERIMENT_KIND == "custom_model_development"
    # an experiment made before (by an older parasweep, or by hand) gets the tag on its next use
    older = client.create_experiment("older")
    assert Tag.EXPERIMENT_KIND not in client.get_experiment(older).tags
    assert ensure_experiment(uri, "older") == older
    assert client.get_experiment(older).tags[Tag.EXPERIMENT_KIND] == EXPERIMENT_KIND


def test_a_layout_that_cannot_fit_is_drawn_without_a_warning(tmp_path: Path) -> None:
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_yticks([0, 1], ["a tick label far too long for a figure two inches wide " * 4, "b"])
    with warnings.catch_warnings(record=True) as plain:  # what matplotlib alone does here
        warnings.simplefilter("always")
        fig.tight_layout()
    assert any("Tight layout not applied" in str(w.message) for w in plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        tight_layout(fig)
    fig.savefig(tmp_path / "drawn.png")
    plt.close(fig)
    assert (tmp_path / "drawn.png").stat().st_size > 0


def test_a_local_ray_address_means_the_same_everywhere() -> None:
    # null, "" and "local" are the sweep's own local Ray: validation, GPU counting and the launcher
    # all ask joins_cluster, so "local" is never taken for a cluster anywhere
    from orchestrator.config.schema import ParasweepConf, joins_cluster
    from orchestrator.config.validate import available_gpus

    assert [joins_cluster(a) for a in (None, "", "local", "auto", "10.0.0.1:6379")] == [
        False, False, False, True, True]
    cfg = ParasweepConf()
    cfg.ray.address = "local"
    assert available_gpus(cfg, "sglang")[1] != "a Ray cluster decides"  # was: taken for a cluster
    cfg.ray.address = "auto"
    assert available_gpus(cfg, "sglang")[1] == "a Ray cluster decides"
