"""spec.* -> SGLang's speculative flags per recorded release, each refusal with the release's own
message (checked against the release's recorded source), and the simulated engine's acceptance flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.drafts import acceptance_flag
from orchestrator.engines.sglang_compat import build_args, check_args
from orchestrator.engines.sglang_compat.speculative import PP_SPEC_SINCE
from orchestrator.engines.sglang_compat.versions import RECORDED, ReleaseFacts, parse_version
from orchestrator.errors import ConfigError
from vocab.assets import model_dir

RELEASES = Path(__file__).resolve().parent.parent / "orchestrator" / "engines" / "sglang_compat" / "releases"


def conf(algorithm: str = "eagle3", model: str = "llama-3.1-8b", **spec: object) -> ParasweepConf:
    cfg = OmegaConf.structured(ParasweepConf)
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.model.drafts = {"eagle3": f"models/eagle3-{model}"}
    cfg.spec.algorithm = algorithm
    for key, value in spec.items():
        setattr(cfg.spec, key, value)
    return cfg  # type: ignore[return-value]


def _checks(version: str) -> str:
    """The release's recorded checks as one text, implicitly joined string literals joined."""
    recorded = json.loads((RELEASES / f"sglang-{version}.json").read_text())["checks"]
    return re.sub(r'"\s*"', "", " ".join(c["source"] for c in recorded))


@pytest.mark.parametrize("version", RECORDED)
def test_the_speculative_flags_are_flags_of_every_recorded_release(version: str) -> None:
    cfg = conf(num_steps=3, topk=1, num_draft_tokens=4, draft_load_format="dummy")
    flags = ReleaseFacts.load(version).flags
    args = check_args(build_args(cfg, 30000, version, flags), flags, version)
    argv = [x for a in args for x in (a.flag, *a.values)]
    i = argv.index("--speculative-algorithm")
    assert argv[i:i + 12] == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                              str(model_dir("models/eagle3-llama-3.1-8b")), "--speculative-num-steps", "3",
                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                              "--speculative-draft-load-format", "dummy"]


def test_sglangs_own_choices_are_left_to_it_and_mtp_needs_no_draft_path() -> None:
    argv = [x for a in build_args(conf(), 30000) for x in (a.flag, *a.values)]
    assert "--speculative-num-steps" not in argv and "--max-running-requests" not in argv
    mtp = [x for a in build_args(conf("mtp", model="deepseek-v3"), 30000) for x in (a.flag, *a.values)]
    assert mtp[mtp.index("--speculative-algorithm") + 1] == "NEXTN"
    assert "--speculative-draft-model-path" not in mtp


@pytest.mark.parametrize("version", RECORDED)
def test_pipeline_parallel_speculation_is_refused_as_each_release_refuses_it(version: str) -> None:
    old = "Pipeline parallelism is not compatible with overlap schedule, speculative decoding"
    checks = _checks(version)
    refuses_all = parse_version(version) < PP_SPEC_SINCE
    # the threshold is where the recorded releases change: before it, the GPU path refuses any speculation
    assert (f'"{old}' in checks or f'{old}, mixed' in checks) == refuses_all
    for algorithm, new in (("eagle3", "Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                                      "speculative decoding"),
                           ("mtp", "PP + speculative decoding (MTP) is only supported on prefill nodes")):
        cfg = conf(algorithm, model="deepseek-v3") if algorithm == "mtp" else conf(algorithm)
        cfg.pp.size = 2
        with pytest.raises(ConfigError) as e:
            build_args(cfg, 30000, version)
        expected = old if refuses_all else new
        assert expected in str(e.value) and expected in checks
        assert parse_version(version) < (0, 5, 12) or "mixed chunked" not in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
@pytest.mark.parametrize("algorithm", ["standalone", "ngram"])
def test_attention_dp_with_standalone_or_ngram_drafting_is_refused_with_the_releases_message(
        version: str, algorithm: str) -> None:
    cfg = conf(algorithm, draft_model="models/llama-3.1-8b" if algorithm == "standalone" else None)
    cfg.tp.size = 2
    cfg.dp.attention = 2
    with pytest.raises(ConfigError) as e:
        build_args(cfg, 30000, version)
    message = f"Currently {algorithm} speculative decoding does not support dp attention."
    assert message in str(e.value) and message in _checks(version)


@pytest.mark.parametrize(("change", "key"), [
    (dict(algorithm="medusa"), "spec.algorithm"),
    (dict(algorithm="none", num_steps=3), "spec.num_steps"),
    (dict(topk=4), "spec.num_steps"),
    (dict(num_steps=0), "spec.num_steps"),
    (dict(algorithm="mtp"), "spec.algorithm"),  # Llama has no MTP layers
    (dict(algorithm="eagle"), "spec.draft_model"),  # and no EAGLE-2 head shipped
])
def test_bad_spec_keys_get_one_line_naming_the_key(change: dict, key: str) -> None:
    cfg = conf(**{k: v for k, v in change.items() if k != "algorithm"})
    cfg.spec.algorithm = change.get("algorithm", "eagle3")
    with pytest.raises(ConfigError) as e:
        build_args(cfg, 30000)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_extra_args_cannot_set_what_spec_sets() -> None:
    cfg = conf()
    cfg.server.extra_args = {"speculative-num-steps": 2}
    flags = ReleaseFacts.load("0.5.23").flags
    with pytest.raises(ConfigError, match=r"set it with spec\.num_steps"):
        check_args(build_args(cfg, 30000, "0.5.23", flags), flags, "0.5.23")


@pytest.mark.parametrize(("acceptance", "source", "flag"), [
    ("auto", "random", "auto:chat"), ("auto", "sharegpt", "auto:chat"), (2.7, "random", "2.7"),
    ([0.8, 0.6], "random", "rates:0.8,0.6"),
])
def test_the_acceptance_reaches_the_simulated_engine(acceptance: object, source: str, flag: str) -> None:
    cfg = conf(acceptance=acceptance)
    cfg.workload.source = source
    assert acceptance_flag(cfg) == flag


def test_dummy_draft_weights_on_sglang_get_the_assumed_accept_length() -> None:
    """A random draft accepts nothing: SGLang's SGLANG_SIMULATE_ACC_LEN makes the measured iteration
    accept what the trial assumes (Llama: SGLang's 5 steps; EAGLE-3 on chat: 3.21 tokens a verify)."""
    from orchestrator.engines.sglang_compat.speculative import simulated_acceptance_env
    from simulator.speculative.acceptance import chain_length, from_table

    cfg = conf()
    expected = chain_length(from_table("eagle3", "chat").rates[0], 5)
    env = simulated_acceptance_env(cfg, "sglang", {})
    assert float(env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(expected, abs=1e-3)
    cfg.spec.num_steps, cfg.spec.topk = 1, 1
    assert float(simulated_acceptance_env(cfg, "sglang", {})["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(
        chain_length(from_table("eagle3", "chat").rates[0], 1), abs=1e-3)
    assert simulated_acceptance_env(cfg, "sim", {}) == {}  # the simulated engine has its own flag
    assert simulated_acceptance_env(cfg, "sglang", {"SGLANG_SIMULATE_ACC_LEN": "2"}) == {}  # the user's
    cfg.model.load_format = "auto"
    assert simulated_acceptance_env(cfg, "sglang", {}) == {}  # real weights accept what they accept


def test_a_measured_accept_length_carries_into_the_trials_predictions() -> None:
    from orchestrator.prediction.modelled import with_measured_acceptance
    from simulator.speculative.acceptance import chain_length

    resolved = {"speculative_num_steps": 5, "speculative_num_draft_tokens": 8}
    changed = with_measured_acceptance(conf(), resolved, [2.4, float("nan"), 2.6])
    rate = changed.spec.acceptance[0]
    assert chain_length(rate, 5) == pytest.approx(2.5, abs=1e-3)  # the mean, at the depth it ran
    assert chain_length(rate, 1) == pytest.approx(1 + rate)  # and what one step would accept
    assert with_measured_acceptance(conf("none"), resolved, [2.5]).spec.acceptance == "auto"
    assert with_measured_acceptance(conf(), resolved, []).spec.acceptance == "auto"


@pytest.mark.parametrize("version", RECORDED)
def test_each_releases_accept_length_in_its_decode_line_is_read(version: str) -> None:
    """The decode line's acceptance part rendered from the release's own recorded format string, inside
    the simulated engine's decode line, read by the parser that reads every release's log."""
    from orchestrator.telemetry.server_log import parse_log_line
    from simulator.logs import decode_line

    formats = json.loads((RELEASES / f"sglang-{version}.json").read_text())["log_formats"]
    source = next(f["source"] for f in formats if f["source"].startswith('f"accept len: {spec_accept_length'))
    part = eval(source, {}, {"spec_accept_length": 2.5, "spec_accept_rate": 0.21})  # an f-string literal
    line = "[2026-12-05 10:00:00] " + decode_line(12, 3000, 0.05, True, 1234.5, 0, (2.5, 0.21))
    assert part in line
    row = parse_log_line(line)
    assert row is not None and row["kind"] == "decode"
    assert (row["accept_len"], row["accept_rate"], row["running_req"]) == (2.5, 0.21, 12)
