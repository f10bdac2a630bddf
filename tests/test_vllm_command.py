"""The ``vllm serve`` command line a trial's config becomes, against every recorded vLLM release's own
flags (``orchestrator/engines/vllm_compat/releases/vllm-<version>.json``, read from each release's wheel
by ``scripts/vllm_facts.py``), and the keys vLLM has no flag for refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.engines.vllm import target_release
from orchestrator.engines.vllm_compat.command import build_args, check_args, vllm_argv
from orchestrator.engines.vllm_compat.versions import RECORDED, UnknownRelease, release
from orchestrator.errors import ConfigError
from vocab.hardware import load_hardware


def _cfg(**keys: object) -> ParasweepConf:
    c = ParasweepConf()
    c.model.name, c.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    c.hardware = load_hardware("h100-sxm-x8")
    for key, value in keys.items():
        group, name = key.split("__")
        setattr(getattr(c, group), name, value)
    return c


# what a sweep sets: the layouts, the caps, the memory fraction, prefix caching off, graphs off, a
# model config override, an extra flag of the user's own
CONFIGS = {
    "default": _cfg(),
    "tp8": _cfg(tp__size=8),
    "tp2 pp4": _cfg(tp__size=2, pp__size=4),
    "dp4 experts spread": _cfg(tp__size=2, dp__size=4, ep__size=8),
    "caps": _cfg(server__max_running_requests=64, server__chunked_prefill_size=8192,
                 server__mem_fraction_static=0.85),
    "no prefix cache, eager": _cfg(server__radix_cache=False, server__cuda_graph=False),
    "override and extra": _cfg(model__override_args={"num_hidden_layers": 4},
                               server__extra_args={"max-model-len": 4096, "disable-log-stats": True}),
    "vllm's own": _cfg(vllm__async_scheduling=True, vllm__block_size=32, vllm__scheduling_policy="priority",
                       vllm__long_prefill_token_threshold=2048),
    "eagle3 drafts": _cfg(spec__algorithm="eagle3", spec__num_steps=3,
                          model__drafts={"eagle3": "models/eagle3-llama-3.1-8b"}),
    "n-gram drafts": _cfg(spec__algorithm="ngram", spec__num_steps=4, spec__topk=1, spec__num_draft_tokens=5),
}


@pytest.mark.parametrize("version", RECORDED)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_command_line_is_one_the_release_accepts(version: str, name: str) -> None:
    rel = release(version)
    argv = vllm_argv(CONFIGS[name], "python", 8000, version)
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"] and argv[4].endswith("llama-3.1-8b")
    # the release's own flags: each one it has, a value exactly where it takes one, within its choices
    i = 5
    while i < len(argv):
        flag = rel.flags[argv[i]]
        takes = flag.value is True
        if takes:
            assert not argv[i + 1].startswith("--"), (argv[i], argv[i + 1])
            assert not flag.choices or argv[i + 1] in flag.choices
        i += 2 if takes else 1


def test_the_shared_keys_become_vllms_flags() -> None:
    argv = vllm_argv(_cfg(tp__size=2, dp__size=4, ep__size=8, pp__size=1, server__max_running_requests=64,
                          server__chunked_prefill_size=8192, server__mem_fraction_static=0.85,
                          server__radix_cache=False, server__cuda_graph=False, server__random_seed=7),
                     "python", 8123)

    def after(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    sizes = ("--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size")
    layout = tuple(after(f) for f in sizes)
    assert layout == ("2", "4", "1")
    assert "--enable-expert-parallel" in argv  # ep.size = tp.size x dp.size: every GPU holds experts
    assert (after("--max-num-seqs"), after("--max-num-batched-tokens"), after("--gpu-memory-utilization")) \
        == ("64", "8192", "0.85")
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv and after("--seed") == "7"
    assert (after("--host"), after("--port"), after("--load-format")) == ("127.0.0.1", "8123", "dummy")
    with_cache = vllm_argv(_cfg(), "python", 8000)
    assert "--enable-prefix-caching" in with_cache and "--enforce-eager" not in with_cache
    assert "--max-num-seqs" not in with_cache  # unset: vLLM's own default
    overrides = vllm_argv(_cfg(model__override_args={"num_hidden_layers": 4}), "python", 8000)
    assert json.loads(overrides[overrides.index("--hf-overrides") + 1]) == {"num_hidden_layers": 4}


@pytest.mark.parametrize(("key", "value", "words"), [
    ("pp__async_depth", 4, "pp.async_depth=4: invalid (SGLang's PP async batch depth has no vLLM flag)"),
    ("pp__micro_batch_size", 2, "pp.micro_batch_size=2"),
    ("dp__attention", 8, "dp.attention=8"),
    ("dp__router", "total_requests", "dp.router=total_requests"),
    ("dp__router_impl", "smg", "dp.router_impl=smg"),
    ("ep__a2a_backend", "deepep", "ep.a2a_backend=deepep"),
    ("ep__eplb", True, "ep.eplb=True"),
    ("server__schedule_policy", "lpm", "server.schedule_policy=lpm"),
    ("spec__algorithm", "eagle", "spec.num_steps=None: invalid (vLLM's --speculative-config needs "
                                 "num_speculative_tokens"),
    ("ep__size", 4, "ep.size=4: invalid (vLLM spreads the experts over every GPU of the TP and DP groups"),
])
def test_keys_vllm_has_no_flag_for_are_refused_in_one_line(key: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_args(_cfg(**{key: value}), 8000)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    assert "valid:" in str(e.value)


def test_a_moe_trial_s_experts_over_every_dp_rank_pass_validation_on_vllm_only() -> None:
    """vLLM's expert parallelism spans the DP ranks (ep.size = tp.size x dp.size); SGLang's lives inside
    the TP group, and each engine's trial is held to its own rule."""
    def moe(engine: str, **keys: object) -> ParasweepConf:
        c = _cfg(pp__size=1, **keys)
        c.model.name, c.model.path = "qwen3-30b-a3b", "models/qwen3-30b-a3b"
        c.engine.name = engine
        c.workload.concurrency = [4]
        return c

    validate(moe("vllm", tp__size=1, dp__size=4, ep__size=4))
    with pytest.raises(ConfigError, match=r"^ep\.size=4: invalid \(expert parallelism lives inside the TP"):
        validate(moe("sglang", tp__size=1, dp__size=4, ep__size=4))


def test_a_flag_the_release_lacks_is_refused_against_its_key() -> None:
    # --disable-log-requests: in 0.11.2, gone from later releases (read from the wheels)
    assert "--disable-log-requests" in release("0.11.2").flags
    assert "--disable-log-requests" not in release("0.19.0").flags
    cfg = _cfg(server__extra_args={"disable-log-requests": True})
    assert "--disable-log-requests" in vllm_argv(cfg, "python", 8000, "0.11.2")
    with pytest.raises(ConfigError, match=r"^server\.extra_args\.disable-log-requests=True: invalid "
                                          r"\(vLLM 0\.19\.0 has no --disable-log-requests \(flags read from "
                                          r"vllm-0\.19\.0-"):
        vllm_argv(cfg, "python", 8000, "0.19.0")
    with pytest.raises(ConfigError, match="takes one of its choices") as e:
        check_args(build_args(_cfg(server__extra_args={"kv-cache-dtype": "int3"}), 8000), release("0.19.0"))
    assert "valid: auto, bfloat16, float16, fp8," in str(e.value)
    with pytest.raises(ConfigError, match="takes no value"):
        vllm_argv(_cfg(server__extra_args={"disable-log-stats": "yes"}), "python", 8000)
    with pytest.raises(ConfigError, match=r"set it with vllm\.async_scheduling"):
        build_args(_cfg(server__extra_args={"async-scheduling": True}), 8000)
    with pytest.raises(ConfigError, match=r"set it with server\.max_running_requests"):
        build_args(_cfg(server__extra_args={"max-num-seqs": 8}), 8000)


def test_the_release_checked_against_is_said() -> None:
    assert target_release(None)[0] == RECORDED[-1]
    assert target_release("0.17.0") == ("0.17.0", "vLLM 0.17.0 installed (its recorded flags)")
    chosen, why = target_release("0.20.2")
    assert chosen == "0.19.0" and "not recorded" in why
    with pytest.raises(UnknownRelease, match=r"valid: 0\.11\.2"):
        release("0.13.0")


def test_vllms_own_keys_become_its_flags_where_the_release_has_them() -> None:
    own = _cfg(vllm__async_scheduling=False, vllm__block_size=32, vllm__scheduling_policy="priority",
               vllm__max_num_partial_prefills=1)
    argv = vllm_argv(own, "python", 8000, "0.19.0")
    assert "--no-async-scheduling" in argv and argv[argv.index("--block-size") + 1] == "32"
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert argv[argv.index("--max-num-partial-prefills") + 1] == "1"
    # gone from 0.34 (read from its wheel): refused against the key, naming the release
    with pytest.raises(ConfigError, match=r"^vllm\.max_num_partial_prefills=1: invalid \(vLLM 0\.34\.0 "
                                          r"has no --max-num-partial-prefills"):
        vllm_argv(_cfg(vllm__max_num_partial_prefills=1), "python", 8000, "0.34.0")
    # more than one: every release with the flag refuses it at start-up, in its words
    with pytest.raises(ConfigError, match=r"^vllm\.max_num_partial_prefills=2: invalid \(vLLM refuses it at "
                                          r"start-up \(Concurrent Partial Prefill is not supported"):
        vllm_argv(_cfg(vllm__max_num_partial_prefills=2), "python", 8000, "0.19.0")


def test_vllms_own_keys_are_refused_on_another_engine() -> None:
    cfg = _cfg(vllm__async_scheduling=True)
    cfg.engine.name = "sim"
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith("vllm.async_scheduling=True: invalid (a flag of vLLM only); "
                                   "valid: null with engine=sim")
    cfg = _cfg(vllm__scheduling_policy="lpm")
    cfg.engine.name, cfg.dry_run = "vllm", True
    with pytest.raises(ConfigError, match=r"vllm\.scheduling_policy=lpm: invalid; valid: fcfs, priority"):
        validate(cfg)


@pytest.mark.parametrize("version", RECORDED)
def test_speculation_is_one_json_config_of_the_release_s_own_methods(version: str) -> None:
    argv = vllm_argv(CONFIGS["eagle3 drafts"], "python", 8000, version)
    conf = json.loads(argv[argv.index("--speculative-config") + 1])
    draft = str(Path("models/eagle3-llama-3.1-8b").resolve())
    assert {k: conf[k] for k in ("method", "num_speculative_tokens", "model")} == {
        "method": "eagle3", "num_speculative_tokens": 3, "model": draft}
    # dummy weights (the default): from 0.34 the draft is accepted by the rates the trial assumes
    assert ("synthetic_acceptance_rates" in conf) is (version == "0.34.0")
    assert conf["method"] in release(version).speculative_methods  # read from the wheel
    ngram = vllm_argv(CONFIGS["n-gram drafts"], "python", 8000, version)
    assert json.loads(ngram[ngram.index("--speculative-config") + 1]) == {"method": "ngram",
                                                                         "num_speculative_tokens": 4}


@pytest.mark.parametrize(("keys", "words"), [
    ({"spec__num_steps": 3, "spec__topk": 4}, "spec.topk=4: invalid (vLLM drafts a chain"),
    ({"spec__num_steps": 3, "spec__num_draft_tokens": 8},
     "spec.num_draft_tokens=8: invalid (vLLM verifies the drafts and the request's own next token); valid: "
     "null or spec.num_steps + 1 = 4"),
    ({"spec__num_steps": 3, "spec__draft_load_format": "auto"}, "spec.draft_load_format=auto: invalid"),
])
def test_what_a_chain_cannot_be_is_refused_against_its_key(keys: dict, words: str) -> None:
    cfg = _cfg(spec__algorithm="eagle3", model__drafts={"eagle3": "models/eagle3-llama-3.1-8b"},
               model__load_format="dummy", **keys)
    with pytest.raises(ConfigError) as e:
        build_args(cfg, 8000)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)


@pytest.mark.parametrize(("version", "words"), [
    ("0.12.0", "with EAGLE/MTP kind of speculative decoding)"),
    ("0.16.0", "with EAGLE/MTP/Draft Model kind of speculative decoding.)"),
    ("0.19.0", "with EAGLE/MTP/Draft Model/NGram GPU kind of speculative decoding)"),
])
def test_async_scheduling_asked_for_with_n_gram_drafts_is_refused_as_the_release_does(version: str,
                                                                                     words: str) -> None:
    cfg = _cfg(spec__algorithm="ngram", spec__num_steps=3, vllm__async_scheduling=True)
    with pytest.raises(ConfigError) as e:
        vllm_argv(cfg, "python", 8000, version)
    assert str(e.value).startswith(f"vllm.async_scheduling=True: invalid (vLLM {version}: Currently, async "
                                   "scheduling is only supported " + words)
    vllm_argv(cfg, "python", 8000, "0.34.0")  # 0.34 runs any method asynchronously


def test_a_whole_draft_model_needs_vllm_0_15() -> None:
    cfg = _cfg(spec__algorithm="standalone", spec__num_steps=2, spec__draft_model="models/llama-3.1-8b")
    with pytest.raises(ConfigError, match=r"^spec.algorithm=standalone: invalid \(vLLM 0.12.0: Draft model "
                                          r"speculative decoding is not supported yet"):
        vllm_argv(cfg, "python", 8000, "0.12.0")
    argv = vllm_argv(cfg, "python", 8000, "0.15.1")
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "draft_model"


def test_a_dummy_weight_draft_is_accepted_by_the_assumed_rates_from_0_34() -> None:
    from orchestrator.engines.vllm import VLLMEngine
    from simulator.predict import load_config

    cfg = _cfg(spec__algorithm="eagle3", spec__num_steps=3, model__load_format="dummy",
               model__drafts={"eagle3": "models/eagle3-llama-3.1-8b"})
    argv = vllm_argv(cfg, "python", 8000, "0.34.0")
    conf = json.loads(argv[argv.index("--speculative-config") + 1])
    rates = conf["synthetic_acceptance_rates"]
    assert conf["rejection_sample_method"] == "synthetic" and len(rates) == 3
    assert 1 > rates[0] >= rates[1] >= rates[2] > 0  # unconditional: each no likelier than the one before
    # the simulated engine given the same config accepts by the same rates
    served = load_config(["serve", "models/llama-3.1-8b", "--sim-hardware", "h100-sxm-x8",
                          "--sim-vllm-release", "0.34.0", "--speculative-config", json.dumps(conf)])
    assert served.speculative is not None
    assert served.speculative.expected_accept_length == pytest.approx(1 + sum(rates), abs=1e-3)
    older = vllm_argv(cfg, "python", 8000, "0.19.0")  # its default runner does not read it: said so
    assert "synthetic" not in older[older.index("--speculative-config") + 1]
    cfg.vllm.release = "0.19.0"
    notes = VLLMEngine().plan_notes(cfg)
    assert any("accepts a dummy-weight draft's tokens almost never" in n for n in notes)
    cfg.model.load_format = "auto"  # real weights: their own acceptance
    assert "synthetic" not in vllm_argv(cfg, "python", 8000, "0.34.0")[-1]
