"""Speculative decoding on the simulated engine playing vLLM (``--speculative-config``), in virtual time: a
decoding request verifies its k drafts with its own next token out of the step's token budget, the
drafter runs after prompt-bearing steps too, vLLM's counters and its ``SpecDecoding metrics`` line report
the drafts (read back by the parser of real vLLM logs), and what each release refuses is refused in its
words."""

from __future__ import annotations

import io
import json
import re
from importlib import resources
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.engines.vllm_compat.versions import RECORDED, release
from orchestrator.telemetry.stage_series import stage_frame
from orchestrator.telemetry.vllm_log import resolved_from_vllm_log, vllm_log_frame
from simulator.predict import VirtualTrial, load_config
from simulator.vllm.logs import VLLMLogWriter
from simulator.vllm.metrics import VLLMMetrics
from simulator.vllm.reporter import StatsLine, VLLMReporter
from simulator.vllm.scheduler import VLLMReplica
from simulator.vllm.server import startup_lines
from tests.test_vllm_sim import _recording
from vocab.load import LoadPoint, RequestSpec

MODEL = "models/llama-3.1-8b"
EAGLE3 = {"method": "eagle3", "model": "models/eagle3-llama-3.1-8b", "num_speculative_tokens": 3}


def _serve(conf: dict | None, *flags: str) -> list[str]:
    spec = ["--speculative-config", json.dumps(conf)] if conf is not None else []
    return ["serve", MODEL, "--sim-hardware", "h100-sxm-x8", *spec, *flags]


def _run(trial: VirtualTrial, concurrency: int = 8, requests: int = 32, input_len: int = 1500,
         output_len: int = 200) -> dict[str, float]:
    return trial.run_point(LoadPoint(concurrency=concurrency, num_requests=requests),
                           RequestSpec(api="completions", input_len=input_len, output_len=output_len,
                                       seed=4)).metrics


def test_a_decode_verifies_its_drafts_out_of_the_step_s_token_budget() -> None:
    trial = VirtualTrial(load_config(_serve(EAGLE3, "--max-num-batched-tokens", "1024",
                                            "--sim-spec-acceptance", "2.2")))
    steps = _recording(trial)
    metrics = _run(trial)
    assert metrics["completed"] == 32 and metrics["output_tokens_total"] == 32 * 200  # none lost, none extra
    decodes = [b for b in steps if b.decode]
    assert decodes and all(b.shape.tokens == 4 * len(b.reqs) and b.shape.width == 4 for b in decodes)
    mixed = [b for b in steps if not b.decode and b.mixed]
    assert mixed  # running requests verify in the same step as another's prompt chunk
    for b in mixed:  # each takes k + 1 = 4 tokens of the 1,024 before the chunk takes the rest
        assert b.shape.tokens == sum(it.tokens for it in b.items) + 4 * len(b.mixed) <= 1024
    rep = trial.replicas[0]
    assert isinstance(rep, VLLMReplica)
    # the drafter ran after the prompt-bearing steps too: its share of the GPU exceeds the decodes' own
    assert rep.spec_stats.seconds["extend"] > 0 and rep.spec_stats.seconds["draft"] > 0
    # speculation pays here: fewer steps per token than one token per step would take
    assert metrics["tpot_mean_ms"] < _run(VirtualTrial(load_config(_serve(None))))["tpot_mean_ms"]


def test_the_counters_and_the_spec_line_read_back_as_vllm_s(tmp_path: Path) -> None:
    cfg = load_config(_serve(EAGLE3, "--sim-spec-acceptance", "2.5", "--sim-vllm-release", "0.19.0"))
    trial = VirtualTrial(cfg)
    _run(trial, concurrency=16, requests=64, input_len=300, output_len=300)
    rep = trial.replicas[0]
    assert isinstance(rep, VLLMReplica)
    metrics = VLLMMetrics("m", [rep], cfg.context_len)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    recorded = release("0.19.0").metrics  # read from the release's wheel
    spec = {n: f.type for n, f in families.items() if n.startswith("vllm:spec_decode")}
    assert spec == {n: recorded[n] for n in spec} and len(spec) == 4
    drafts = families["vllm:spec_decode_num_drafts"].samples[0].value
    accepted = families["vllm:spec_decode_num_accepted_tokens"].samples[0].value
    assert families["vllm:spec_decode_num_draft_tokens"].samples[0].value == 3 * drafts
    per_pos = sorted((s.labels["position"], s.value) for s in families[
        "vllm:spec_decode_num_accepted_tokens_per_pos"].samples if s.name.endswith("_total"))
    assert [p for p, _ in per_pos] == ["0", "1", "2"] and sum(v for _, v in per_pos) == accepted
    assert per_pos[0][1] >= per_pos[1][1] >= per_pos[2][1]  # a later draft is kept only after the earlier
    # 1 + accepted per draft: the acceptance model's mean of 2.5, over ~6,000 drafts
    assert 1 + accepted / drafts == pytest.approx(2.5, abs=0.1)

    out = io.StringIO()
    log = VLLMLogWriter(stream=out)
    log.wall = lambda: 1.8e9
    reporter = VLLMReporter(metrics, 0)
    reporter.generated = 64 * 300
    StatsLine(rep, reporter, 0, "0.19.0", log).tick(trial.sim.now)
    text = out.getvalue()
    spec_line = next(line for line in text.splitlines() if "SpecDecoding metrics:" in line)
    recorded_formats = json.loads((resources.files("orchestrator.engines.vllm_compat.releases")
                                   / "vllm-0.19.0.json").read_text())["log_formats"]
    fmt = next(f for f in recorded_formats if f.startswith("SpecDecoding"))  # read from the wheel
    pattern = re.escape(fmt).replace("%\\.2f", r"[\d.]+").replace("%d", r"\d+").replace("%\\.1f", r"[\d.]+")
    assert re.search(pattern.replace("%s", r"[\d., ]+").replace("%%", "%"), spec_line)  # the wheel's format
    path = tmp_path / "server.log"
    path.write_text(text)
    row = vllm_log_frame(path).query("kind == 'spec'").iloc[0]
    assert row["accept_len"] == pytest.approx(1 + accepted / drafts, abs=0.005)
    assert row["spec_accept_rate"] == pytest.approx(accepted / (3 * drafts), abs=0.001)


def test_the_engine_line_says_the_method_and_depth_parasweep_resolves() -> None:
    out = io.StringIO()
    log = VLLMLogWriter(stream=out)
    startup_lines(load_config(_serve(EAGLE3)), log)
    resolved = resolved_from_vllm_log(out.getvalue().splitlines())
    assert (resolved["speculative_algorithm"], resolved["speculative_num_steps"],
            resolved["speculative_num_draft_tokens"]) == ("eagle3", 3, 4)


def test_the_scraped_counters_give_each_interval_s_accept_length() -> None:
    import pandas as pd

    rows = []
    for ts, drafts, accepted in ((0.0, 0, 0), (10.0, 100, 150), (20.0, 300, 350)):
        for name, value in (("vllm:spec_decode_num_drafts_total", drafts),
                            ("vllm:spec_decode_num_accepted_tokens_total", accepted),
                            ("vllm:num_requests_running", 8)):
            rows.append({"ts": ts, "name": name, "labels": json.dumps({"model_name": "m", "engine": "0"}),
                         "value": float(value)})
    frame = stage_frame(None, pd.DataFrame(rows))
    assert frame is not None
    assert frame["accept_len"].tolist()[1:] == [2.5, 2.0]  # 1 + 150 / 100, then 1 + 200 / 200


@pytest.mark.parametrize(("conf", "flags", "says"), [
    ({"method": "eagle3", "model": "models/eagle3-llama-3.1-8b"}, [],
     "num_speculative_tokens must be provided with speculative model unless the draft model config contains "
     "an n_predict parameter."),
    ({"method": "eagle", "num_speculative_tokens": 2}, [],
     "num_speculative_tokens was provided but without speculative model."),
    ({"method": "ngram", "num_speculative_tokens": 2}, ["--async-scheduling", "--sim-vllm-release", "0.19.0"],
     "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU kind of "
     "speculative decoding"),
    ({"method": "draft_model", "model": MODEL, "num_speculative_tokens": 2}, ["--sim-vllm-release", "0.12.0"],
     "Draft model speculative decoding is not supported yet."),
    ({"method": "mtp", "num_speculative_tokens": 1}, [], "has no MTP layers"),
    ({"method": "medusa", "num_speculative_tokens": 1, "model": MODEL}, [], "is not modelled"),
])
def test_what_the_release_refuses_is_refused_in_its_words(conf: dict, flags: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_config(_serve(conf, *flags))


@pytest.mark.parametrize("version", RECORDED)
def test_n_gram_drafts_turn_async_scheduling_off_where_the_release_does(version: str) -> None:
    cfg = load_config(_serve({"method": "ngram", "num_speculative_tokens": 3}, "--sim-vllm-release", version,
                             "--sim-spec-acceptance", "1.8"))
    on = {"0.11.2": False, "0.12.0": False, "0.34.0": True}.get(version, False)
    assert cfg.disable_overlap_schedule is not on
    if version not in ("0.11.2", "0.12.0", "0.34.0"):  # on by default, off for n-gram with vLLM's warning
        assert any("Async scheduling not supported with ngram-based" in w for w in cfg.warnings)
    eagle = load_config(_serve(EAGLE3, "--sim-vllm-release", version, "--max-num-seqs", "32"))
    assert eagle.disable_overlap_schedule is (version in ("0.11.2", "0.12.0"))  # EAGLE keeps the default
    # the largest graph, in tokens: 2 x 32 before 0.15, 2 x 32 x (k + 1) from it; a verify is 4 tokens a
    # request, and no graph holds more requests than may run
    assert eagle.cost.graph_requests(4) == (16 if version in ("0.11.2", "0.12.0") else 32)


def test_0_34_s_synthetic_acceptance_is_what_the_simulated_engine_accepts_by() -> None:
    conf = {**EAGLE3, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}
    cfg = load_config(_serve(conf, "--sim-vllm-release", "0.34.0", "--sim-spec-acceptance", "1.2"))
    assert cfg.speculative is not None
    # vLLM's minimum-variance schedule for 1.5 accepted drafts of 3: [1, 0.5, 0]; it wins over the flag
    assert cfg.speculative.acceptance.survival(3) == [1.0, 0.5, 0.0]
    assert cfg.speculative.expected_accept_length == pytest.approx(2.5)
    before = load_config(_serve(conf, "--sim-vllm-release", "0.19.0", "--sim-spec-acceptance", "1.2"))
    assert before.speculative.expected_accept_length == pytest.approx(1.2)  # not read before 0.34
    assert any("not read by this release's default model runner" in w for w in before.warnings)


@pytest.mark.parametrize(("extra", "says"), [
    ({"rejection_sample_method": "synthetic"},
     "rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
     "synthetic_acceptance_length."),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.7, 0.2]},
     "synthetic_acceptance_rates must be non-increasing, got [0.5, 0.7, 0.2]."),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 5},
     "synthetic_acceptance_length must be in [1, 4], got 5."),
    ({"synthetic_acceptance_length": 2}, "are only valid with rejection_sample_method='synthetic'."),
    ({"draft_tensor_parallel_size": 1}, "--speculative-config keys not modelled by the simulated engine: "
                                        "draft_tensor_parallel_size"),
])
def test_a_synthetic_acceptance_vllm_would_refuse_is_refused_in_its_words(extra: dict, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_config(_serve({**EAGLE3, **extra}, "--sim-vllm-release", "0.34.0"))


def test_speculation_on_a_moe_model_s_lockstep_dp_ranks_is_refused_as_not_modelled() -> None:
    argv = ["serve", "models/deepseek-v3", "--sim-hardware", "h200-nvlink-x8", "-tp", "4", "-dp", "2",
            "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 2})]
    with pytest.raises(ValueError, match="with --data-parallel-size > 1 on a MoE model is not modelled"):
        load_config(argv)
