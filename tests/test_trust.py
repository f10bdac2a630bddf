"""How far to trust a prediction: the model's error on published runs like the configuration's
(``data/published/errors.json`` and ``silicon_errors.json``, written by benchmarks/fidelity_corpus.py from
the replays), of every number and of each kind, and the diagnosis and "run this instead" saying when a
predicted gain is inside it."""

from __future__ import annotations

import json
import statistics

from analysis.report import _effect_numbers, instead_lines
from orchestrator.config.schema import ParasweepConf
from orchestrator.fidelity.trust import (
    ERRORS_FILE,
    MIN_ENTRIES,
    SILICON_ERRORS_FILE,
    SILICON_VLLM_ERRORS_FILE,
    TPOT,
    TTFT,
    band_for,
    band_for_config,
    bands_text,
    family_of,
    kind_of,
)
from vocab.assets import published_dir
from vocab.hardware import load_hardware

CORPUS = json.loads((published_dir() / ERRORS_FILE).read_text())["compared"]
SILICON = json.loads((published_dir() / SILICON_ERRORS_FILE).read_text())["compared"]
# both in one shape: (id, metric, error, family, layout, hardware)
ROWS = CORPUS + [{"id": r["id"], "metric": f"mean_{m}", "error": e, "family": r["kind"],
                  "layout": r["layout"], "hardware": r["hardware"]}
                 for r in SILICON if not r.get("apart")  # rows scored apart are no error of the model's
                 for m, e in r["error"]["parasweep"].items() if e is not None]


def _cfg(model: str, hardware: str, pp: int = 1) -> ParasweepConf:
    c = ParasweepConf()
    c.model.name, c.model.path = model, f"models/{model}"
    c.hardware = load_hardware(hardware)
    c.pp.size = pp
    return c


def test_a_band_is_the_median_error_of_the_most_specific_group_with_enough_runs() -> None:
    key = ("dense", "TP", "h200-nvlink-x8")
    exact = [r for r in ROWS if (r["family"], r["layout"], r["hardware"]) == key]
    assert len({r["id"] for r in exact}) >= MIN_ENTRIES
    band = band_for("dense", "TP", "h200-nvlink-x8")
    assert band is not None and band.entries == len({r["id"] for r in exact})
    assert band.error == statistics.median(abs(r["error"]) for r in exact)
    assert band.text().startswith(f"±{100 * band.error:.0f} % (median) on {band.entries} published dense TP")
    # a GPU with too few published runs of the family: the family's band
    family = band_for("dense", "TP", "rtx-pro-6000-pcie-x8")
    assert family is not None and family.group == "dense runs"
    # a family with none at all: the corpus's
    assert band_for("router", "TP", "h100-sxm-x8").group == "runs"  # type: ignore[union-attr]


def test_a_band_of_one_kind_of_number_reads_only_those() -> None:
    key = ("moe", "TP", "b200-sxm-x8")  # published corpus runs and InferenceX's served runs alike
    exact = [r for r in ROWS if (r["family"], r["layout"], r["hardware"]) == key]
    ttft = [r for r in exact if kind_of(r["metric"]) == TTFT]
    tpot = [r for r in exact if kind_of(r["metric"]) == TPOT]
    assert {r["id"] for r in ttft} & {r["id"] for r in SILICON}  # the served rows count
    # ... but not those scored apart (measured without the client's warm-up: one-off costs)
    cold = {r["id"] for r in SILICON if r.get("apart")
            and (r["kind"], r["layout"], r["hardware"]) == key}
    assert cold and band_for(*key, TTFT).entries == len({r["id"] for r in ttft})  # type: ignore[union-attr]
    assert not cold & {r["id"] for r in ttft}
    for kind, rows in ((TTFT, ttft), (TPOT, tpot)):
        band = band_for(*key, kind)
        assert band is not None and band.kind == kind
        assert band.error == statistics.median(abs(r["error"]) for r in rows)
        assert band.text().startswith(f"{kind} ±")
    # the model misses TTFT by more than TPOT on these runs: one band for both would hide it
    assert band_for(*key, TTFT).error > band_for(*key, TPOT).error  # type: ignore[union-attr]
    text = bands_text(_cfg("deepseek-v3", "b200-sxm-x8"))
    assert "TTFT ±" in text and "TPOT/ITL ±" in text


def test_a_change_of_family_carries_the_wider_band() -> None:
    dense = band_for_config(_cfg("llama-3.1-8b", "h200-nvlink-x8"))
    to_pp = band_for_config(_cfg("llama-3.1-8b", "h200-nvlink-x8"), {"pp.size": 2, "tp.size": 4})
    pp = band_for("pp", "TP", "h200-nvlink-x8")
    assert dense is not None and to_pp is not None and pp is not None
    assert to_pp.error == max(dense.error, pp.error)


def test_a_gain_inside_the_band_is_said_to_be() -> None:
    effect = {"baseline": {"output_tok_s": 100.0}, "predicted": {"output_tok_s": 110.0},
              "change_pct": {"output_tok_s": 10.0}, "model_error_pct": 24.0}
    assert _effect_numbers(effect).endswith("inside the model's ±24 % error")
    effect |= {"predicted": {"output_tok_s": 150.0}, "change_pct": {"output_tok_s": 50.0}}
    assert "inside" not in _effect_numbers(effect)
    answer = {"recommend": {"change": {"tp.size": 8}, "gpus": 8, "loads": ["c8"], "source": "x",
                            "per_load": {"c8": {"predicted": {"output_tok_s": 110.0},
                                                "trial_predicted": {"output_tok_s": 100.0},
                                                "change_pct": {"output_tok_s": 10.0}, "best_trial": "#0",
                                                "inside_model_error": True}}}}
    assert any("inside the model's error" in line for line in instead_lines(answer, width=200))


def test_a_disaggregated_deployment_carries_the_band_of_disaggregated_runs() -> None:
    recorded = json.loads((published_dir() / SILICON_ERRORS_FILE).read_text())["disaggregated"]
    scored = [r for r in recorded if not r.get("apart")]
    assert scored  # written by benchmarks/fidelity_corpus.py --silicon --update
    c = _cfg("deepseek-v3", "b200-sxm-x8")
    c.pd.enabled = True
    c.pd.decode.attention = 8
    family, layout, hardware = family_of(c)
    assert (family, layout) == ("moe", "disaggregated attention DP")
    exact = [r for r in scored if (r["kind"], r["layout"], r["hardware"]) == (family, layout, hardware)]
    band = band_for_config(c, kind=TTFT)
    assert band is not None and band.entries == len(exact) >= MIN_ENTRIES
    assert band.error == statistics.median(abs(r["error"]["parasweep"]["ttft_ms"]) for r in exact)
    # a GPU without disaggregated runs: the family's disaggregated runs on every GPU, not its single servers
    c.hardware = load_hardware("h100-sxm-x8")
    elsewhere = band_for_config(c, kind=TTFT)
    assert elsewhere is not None and elsewhere.group == "moe disaggregated runs"
    c.pd.enabled = False
    assert family_of(c)[1] == "TP"


def test_a_vllm_trial_is_judged_by_vllm_s_runs_alone() -> None:
    recorded = json.loads((published_dir() / SILICON_VLLM_ERRORS_FILE).read_text())["compared"]
    scored = [r for r in recorded if not r.get("apart")]  # written by fidelity_corpus.py --backend vllm
    c = _cfg("llama-3.1-70b", "h200-nvlink-x8")
    c.engine.name = "sim-vllm"
    key = ("dense", "TP", "h200-nvlink-x8")
    exact = [r for r in scored if (r["kind"], r["layout"], r["hardware"]) == key]
    band = band_for_config(c, kind=TPOT)
    assert band is not None and band.entries == len(exact) >= MIN_ENTRIES
    assert band.error == statistics.median(abs(r["error"]["parasweep"]["tpot_ms"]) for r in exact)
    assert band.group == "vLLM dense TP runs on h200-nvlink-x8" and "published vLLM dense TP" in band.text()
    # the same configuration on SGLang quotes SGLang's runs; a vLLM layout no vLLM run has: every vLLM run
    c.engine.name = "sim"
    assert not band_for_config(c, kind=TPOT).group.startswith("vLLM")  # type: ignore[union-attr]
    c.engine.name, c.pp.size = "vllm", 2
    assert band_for_config(c).group == "vLLM runs"  # type: ignore[union-attr]
