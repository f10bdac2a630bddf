"""Speculative decoding in the simulator's model: SGLang's own resolution of the flags (against the
release's recorded source), the acceptance model, and the predicted speedup: at concurrency 1 from
first principles, and shrinking with the batch until verification is compute-bound."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest

from simulator.costs import decode_shape
from simulator.predict import load_config, predict_point
from simulator.speculative.acceptance import (
    PUBLISHED,
    AcceptanceError,
    chain_length,
    from_table,
    parse_acceptance,
    rate_for_length,
)
from simulator.speculative.iteration import step_shape
from simulator.speculative.params import SpecFlagError, auto_params, resolve_spec
from workloads import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "orchestrator" / "engines" / "sglang_compat" / "releases"
LLAMA = ["--model-path", str(REPO / "models" / "llama-3.1-8b"), "--sim-hardware", "h100-sxm-x8",
         "--random-seed", "0"]
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          str(REPO / "models" / "eagle3-llama-3.1-8b")]


def _sglang_auto(release: str, algorithm: str, arch: str) -> tuple[int, int, int]:
    """The release's own auto_choose_speculative_params, branch by branch as recorded from its wheel."""
    branches = json.loads((RELEASES / f"sglang-{release}.json").read_text())["spec_auto_params"]
    for b in branches:
        when = b["when"]
        if when == "else":
            return tuple(b["returns"])
        if "STANDALONE" in when:
            if algorithm == "STANDALONE":
                return tuple(b["returns"])
        elif re.search(rf'"{arch}"', when):
            return tuple(b["returns"])
    raise AssertionError("no else branch recorded")


@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM",
                                  "Qwen3ForCausalLM", "Grok1ForCausalLM"])
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "STANDALONE"])
def test_the_automatic_steps_topk_and_draft_tokens_are_the_releases_own(release: str, arch: str,
                                                                        algorithm: str) -> None:
    assert auto_params(algorithm, arch) == _sglang_auto(release, algorithm, arch)


def _resolve(**kw):  # type: ignore[no-untyped-def]
    base = dict(architecture="LlamaForCausalLM", model_path="m", draft_model_path="d", num_steps=None,
                topk=None,
                draft_tokens=None, page_size=1, attention_backend="fa3", attn_dp=False, pp_size=1,
                pp_spec_enabled=False)
    base.update(kw)
    return resolve_spec(base.pop("algorithm", "EAGLE3"), **base)


def test_resolution_follows_sglang_where_the_user_leaves_things_unset() -> None:
    llama = _resolve()
    assert (llama.num_steps, llama.topk, llama.num_draft_tokens) == (5, 4, 8)
    assert llama.max_accept_length == 6
    chain = _resolve(num_steps=3, topk=1, draft_tokens=9)  # topk 1: draft tokens forced to steps + 1
    assert chain.num_draft_tokens == 4 and any("adjusted" in w for w in chain.warnings)
    mtp = _resolve(algorithm="NEXTN", architecture="DeepseekV3ForCausalLM", draft_model_path=None)
    assert (mtp.algorithm, mtp.asked, mtp.draft_model_path) == ("EAGLE", "NEXTN", "m")
    ngram = _resolve(algorithm="NGRAM", draft_model_path=None)
    assert (ngram.topk, ngram.num_draft_tokens, ngram.num_steps) == (10, 12, 1)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(pp_size=2, algorithm="EAGLE"),
     "PP + speculative decoding (MTP) is only supported on prefill nodes"),
    (dict(pp_size=2, algorithm="EAGLE3", pp_spec_enabled=True), "only supports EAGLE (non-multi-layer)"),
    (dict(algorithm="NGRAM", attn_dp=True), "ngram speculative decoding does not support dp attention"),
    (dict(algorithm="STANDALONE", attn_dp=True), "standalone speculative decoding does not support dp"),
    (dict(attention_backend="trtllm_mha"), "trtllm_mha backend only supports topk = 1"),
    (dict(page_size=16, attention_backend="flashmla"), "only supported on ('flashinfer', 'fa3', 'triton')"),
    (dict(topk=2), "need speculative_num_steps"),
    (dict(draft_model_path=None), "needs --speculative-draft-model-path"),
])
def test_what_sglang_refuses_is_refused_with_its_message(kw: dict, message: str) -> None:
    with pytest.raises(SpecFlagError, match=re.escape(message)):
        _resolve(**kw)


def test_the_refusal_messages_are_the_recorded_releases_own() -> None:
    """Each message above that SGLang raises itself appears in 0.5.23's recorded checks."""
    recorded = json.loads((RELEASES / "sglang-0.5.23.json").read_text())["checks"]
    checks = re.sub(r'"\s*"', "", " ".join(c["source"] for c in recorded))  # implicitly joined literals
    for text in ("PP + speculative decoding (MTP) is only supported on prefill nodes",
                 "Currently ngram speculative decoding does not support dp attention.",
                 "Currently standalone speculative decoding does not support dp attention.",
                 "trtllm_mha backend only supports topk = 1 for speculative decoding."):
        assert text in checks, text


# -- acceptance --------------------------------------------------------------------------------------------

def test_the_chain_formula_and_its_inverse() -> None:
    assert chain_length(0.5, 3) == pytest.approx(1.875)
    for length, steps in ((2.69, 3), (1.7, 1), (3.9, 5)):
        assert chain_length(rate_for_length(length, steps), steps) == pytest.approx(length, abs=1e-9)
    with pytest.raises(AcceptanceError, match=r"outside \[1, 4\]"):
        rate_for_length(4.5, 3)


@pytest.mark.parametrize("given", ["auto:chat", "auto:code", "2.4", "rates:0.9,0.7,0.5"])
def test_sampled_accept_lengths_average_to_the_models_expectation(given: str) -> None:
    acc = parse_acceptance(given, "eagle3", 5)
    draw = acc.sampler(5)
    rng = random.Random(1)
    lengths = [draw(rng.random()) for _ in range(40_000)]
    assert min(lengths) >= 1 and max(lengths) <= 6
    assert sum(lengths) / len(lengths) == pytest.approx(acc.expected_length(5), rel=0.02)


def test_sglangs_forced_accept_length_wins_and_is_met_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "2.3")
    acc = parse_acceptance("auto:chat", "eagle3", 3)
    draw = acc.sampler(3)
    lengths = [draw(i / 1000) for i in range(1000)]  # evenly spread draws: floor and ceil in proportion
    assert set(lengths) == {2, 3} and sum(lengths) / 1000 == pytest.approx(2.3)
    assert "SGLANG_SIMULATE_ACC_LEN=2.3" in acc.source


def test_auto_cites_the_published_rows_it_used() -> None:
    acc = from_table("eagle3", "math")
    rows = [p for p in PUBLISHED if p.kind == "eagle3" and p.traffic == "math"]
    assert len(rows) >= 2 and all(p.source in acc.source for p in rows)
    with pytest.raises(AcceptanceError, match="no published accept length for ngram"):
        from_table("ngram", "chat")


# -- the prediction ----------------------------------------------------------------------------------------

def test_the_speedup_at_concurrency_one_is_the_accepted_tokens_over_the_iterations_cost() -> None:
    """From the step tables: a plain decode step against (steps - 1) draft passes, a verify of the tree's
    tokens and a draft extend, times the expected tokens per verify. The simulated engine's predicted
    throughput ratio at concurrency 1 must be that, within what the prefill and ramp add."""
    plain, spec = load_config(LLAMA), load_config(LLAMA + EAGLE3)
    sd = spec.speculative
    p = sd.params
    ctx = [256 + 128]  # mid-way through a 256 + 256 request
    draft = sd.iteration.draft
    iteration = ((p.num_steps - 1) * draft.stage_time(0, step_shape(ctx, p.topk))
                 + spec.cost.stage_time(0, step_shape(ctx, p.num_draft_tokens))
                 + draft.stage_time(0, step_shape(ctx, p.num_draft_tokens))
                 + (4 * (p.num_steps - 1) + 12) * spec.cost.p.kernel_floor_us * 1e-6)
    expected = sd.expected_accept_length * plain.cost.stage_time(0, decode_shape(ctx)) / iteration
    req = RequestSpec(api="generate", input_len=256, output_len=256)
    point = LoadPoint(num_requests=6, concurrency=1, warmup_requests=1)
    ratio = (predict_point(LLAMA + EAGLE3, point, req).metrics["output_tok_s"]
             / predict_point(LLAMA, point, req).metrics["output_tok_s"])
    assert 1.5 < expected < 4.0
    assert ratio == pytest.approx(expected, rel=0.08)


def test_the_gain_shrinks_with_the_batch_and_turns_into_a_loss_once_verification_is_compute_bound() -> None:
    cfg = load_config([*LLAMA, *EAGLE3, "--max-running-requests", "2048", "--cuda-graph-max-bs-decode",
                       "2048"])
    sd = cfg.speculative
    tau = sd.expected_accept_length
    speedups = []
    for b in (1, 8, 32, 64, 128, 256, 512):
        ctx = [1000] * b
        speedups.append(tau * cfg.cost.stage_time(0, decode_shape(ctx)) / sd.iteration.time(ctx))
    assert speedups[0] > 2.0
    # flat while the verify's b x 8 tokens still stream the weights, then falling
    assert all(later < earlier * 1.01 for earlier, later in itertools.pairwise(speedups))
    assert speedups[3] < 0.8 * speedups[0]
    assert speedups[-1] < 1.0  # the verify is compute-bound: the drafts no longer pay


def test_graphs_are_captured_at_sglangs_speculative_sizes_and_batches_padded_up_to_them() -> None:
    from simulator.speculative.params import cuda_graph_batch_sizes

    assert cuda_graph_batch_sizes(48) == [*range(1, 9), *range(10, 33, 2), 40, 44, 48]
    assert cuda_graph_batch_sizes(49)[-2:] == [48, 49]  # the pool's own size is captured too
    sizes = cuda_graph_batch_sizes(512)
    assert sizes[sizes.index(256) + 1] == 272 and sizes[-1] == 512
    sd = load_config(LLAMA + EAGLE3).speculative
    assert sd.iteration.time([500] * 9) == sd.iteration.time([500] * 10)  # 9 replays the graph of 10
    assert sd.iteration.time([500] * 10) < sd.iteration.time([500] * 11)


def test_a_speculative_server_caps_running_requests_and_says_so() -> None:
    cfg = load_config(LLAMA + EAGLE3)
    assert cfg.max_running_requests == 48 and cfg.cuda_graph_max_bs_decode <= 48
    assert any("reset to 48" in w for w in cfg.warnings)
    assert load_config(LLAMA + EAGLE3 + ["--max-running-requests", "96"]).max_running_requests == 96
    # the draft's weights and its share of every KV cell come out of the pool
    assert cfg.max_total_num_tokens < load_config(LLAMA).max_total_num_tokens
    with pytest.raises(ValueError, match="--sim-spec-acceptance: no published accept length for ngram"):
        load_config([*LLAMA, "--speculative-algorithm", "NGRAM"])


def test_the_searchs_ceiling_stays_a_bound_with_speculation() -> None:
    """A search prunes a candidate whose ceiling cannot beat the best: with speculation each verify emits
    several tokens a request, so a ceiling of one token a step would prune a winner."""
    from simulator.estimates import decode_ceiling

    req = RequestSpec(api="generate", input_len=256, output_len=256)
    for c in (1, 8):
        point = LoadPoint(num_requests=3 * c, concurrency=c, warmup_requests=c)
        predicted = predict_point(LLAMA + EAGLE3, point, req).metrics["output_tok_s"]
        assert decode_ceiling(load_config(LLAMA + EAGLE3), 256, c).tok_s >= predicted
    assert decode_ceiling(load_config(LLAMA + EAGLE3), 256, 1).tok_s > 2 * decode_ceiling(
        load_config(LLAMA), 256, 1).tok_s


def test_a_calibrated_acceptance_is_what_auto_takes(tmp_path: Path) -> None:
    """A calibration profile's measured acceptance (``python -m orchestrator calibrate`` writes it from a
    run's accept lengths) stands in for the published table under ``auto``; a given one still wins."""
    import yaml

    profile = tmp_path / "cal.yaml"
    profile.write_text(yaml.safe_dump({"name": "t", "hardware": "h100-sxm-x8", "spec_acceptance": {
        "eagle3": {"value": 0.6, "source": "accept length 2.2 at 5 steps over 3 point(s), run abc"}}}))
    cfg = load_config([*LLAMA, *EAGLE3, "--sim-calibration", str(profile)])
    assert cfg.speculative.acceptance.rates == (0.6,)
    source = cfg.speculative.acceptance.source
    assert "calibrated" in source and "run abc" in source
    given = load_config([*LLAMA, *EAGLE3, "--sim-calibration", str(profile), "--sim-spec-acceptance", "2"])
    assert given.speculative.expected_accept_length == pytest.approx(2.0)
    profile.write_text(yaml.safe_dump({"name": "t", "hardware": "h100-sxm-x8",
                                       "spec_acceptance": {"eagle3": {"value": 1.5}}}))
    with pytest.raises(ValueError, match=r"spec_acceptance\.eagle3\.value is a per-position acceptance"):
        load_config([*LLAMA, *EAGLE3, "--sim-calibration", str(profile)])


def test_calibration_turns_a_runs_accept_lengths_into_a_per_position_rate() -> None:
    from orchestrator.calibrate import TrialData, measured_acceptance
    from orchestrator.config.schema import ParasweepConf

    def trial(steps: int | None, accept: dict[str, float]) -> TrialData:
        cfg = ParasweepConf()
        cfg.model.path = "models/llama-3.1-8b"
        cfg.spec.algorithm, cfg.spec.num_steps = "eagle3", steps
        if steps == 1:
            cfg.spec.topk = 1
        return TrialData("r", "t", cfg, {}, "sglang", accept)

    # SGLang's own 5 steps for Llama, and one step: each trial's mean at its own depth, then the median
    out = measured_acceptance([trial(None, {"c1": 3.0, "c8": 3.2}), trial(1, {"c1": 1.7})], "run1")
    rate = out["eagle3"]["value"]
    expected = sorted([rate_for_length(3.1, 5), rate_for_length(1.7, 1)])
    assert rate == pytest.approx(sum(expected) / 2, abs=1e-4)
    source = out["eagle3"]["source"]
    assert "3.10 at 5 steps over 2 point(s)" in source and "run run1" in source
    assert measured_acceptance([trial(None, {})], "run1") == {}
