"""The SGLang adapter against what the releases themselves offer.

``orchestrator/engines/sglang_compat/releases/sglang-<version>.json`` were read from SGLang's released
wheels by ``scripts/sglang_facts.py`` (flags, HTTP routes, Prometheus metrics and labels, SGLANG_*
variables, server-argument checks; each file names its wheel and SHA-256). These tests check every
route, flag, metric and variable the adapter uses against each supported release, and that the layouts
SGLang refuses are refused before launch, in one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.sglang_compat import args_to_argv, build_args, check_args
from orchestrator.engines.sglang_compat.versions import (
    OLDEST_SUPPORTED,
    RECORDED,
    RENAMES,
    ReleaseFacts,
    parse_version,
    release_facts,
    supported,
)
from orchestrator.errors import ConfigError
from orchestrator.telemetry.stage_series import GAUGES
from tests.sglang_render import release_record
from vocab.hardware import load_hardware
from vocab.load import ENDPOINTS

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ROOT / "orchestrator" / "engines" / "sglang_compat" / "releases"
SUPPORTED = [release_facts(v) for v in RECORDED]
# the routes a trial asks the engine for: readiness and liveness (process/server.py, process/health.py),
# the resolved configuration (trial/session.py), the metrics scrape, the model list (workloads/backend.py)
# and the three load endpoints
ROUTES_USED = {"/health": "GET", "/server_info": "GET", "/metrics": "GET", "/v1/models": "GET",
               **{path: "POST" for path in ENDPOINTS.values()}}
# what the adapter sets in the engine's environment or reads from it
ENV_USED = ("SGLANG_LOG_MS", "SGLANG_PP_LAYER_PARTITION", "SGLANG_LOG_FORWARD_ITERS",
            "SGLANG_HEALTH_CHECK_TIMEOUT", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION")


def _ids(facts: list[ReleaseFacts]) -> list[str]:
    return [f.version for f in facts]


# tests/data/sglang/flags-<version>-imported.json: the parser each of these releases builds itself
# (SGLang installed without its dependencies, its ServerArgs.add_cli_args run on an argparse parser):
# 0.5.12 registers every flag with add_argument, 0.5.16 from ServerArgs's own annotated fields (where
# dcp_size is declared twice), 0.5.20 and 0.5.23 from namespace classes
IMPORTED = {"0.5.12": 388, "0.5.16": 461, "0.5.20": 495, "0.5.23": 532}


@pytest.mark.parametrize(("version", "actions"), list(IMPORTED.items()))
def test_the_static_reading_matches_the_parser_the_release_builds(version: str, actions: int) -> None:
    imported = json.loads((ROOT / "tests" / "data" / "sglang" / f"flags-{version}-imported.json").read_text())
    static = release_record(version)["flags"]
    as_set = {(tuple(a["options"]), a["dest"], a["takes_value"]) for a in imported["actions"]}
    assert [(tuple(a["options"]), a["dest"], a["takes_value"]) for a in static] == sorted(
        as_set, key=lambda a: a[0][0])  # the same actions, each once
    assert len(as_set) == actions


def test_every_record_names_its_wheel_and_the_supported_range_is_recorded() -> None:
    for path in sorted(RELEASES.glob("sglang-*.json")):
        data = json.loads(path.read_text())
        assert path.name == f"sglang-{data['sglang_version']}.json"
        assert data["wheel"].startswith(f"sglang-{data['sglang_version']}-")
        assert len(data["wheel_sha256"]) == 64
    assert RECORDED[0] == OLDEST_SUPPORTED and all(supported(v) for v in RECORDED)
    assert release_facts("0.5.15").version == "0.5.14"  # between two records: the older one stands in
    assert release_facts("0.6.0").version == RECORDED[-1]


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_every_route_the_adapter_uses_is_served(facts: ReleaseFacts) -> None:
    missing = {p: m for p, m in ROUTES_USED.items() if m not in facts.routes.get(p, [])}
    assert not missing, f"SGLang {facts.version} does not serve {missing}"


def test_the_releases_below_the_range_lack_what_a_trial_needs() -> None:
    # why they are refused: no /server_info (every trial would fail right after the start), and 0.4.6's
    # scheduler metrics carry no pp_rank (every PP stage would collapse into one series)
    for version in ("0.5.3", "0.4.6.post5"):
        facts = ReleaseFacts.load(version)
        assert not supported(version)
        assert "/server_info" not in facts.routes and "/get_server_info" in facts.routes
        assert "SGLANG_LOG_MS" not in facts.env
    assert "pp_rank" not in ReleaseFacts.load("0.4.6.post5").scheduler_labels


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_every_metric_the_stage_series_reads_exists_with_a_stage_label(facts: ReleaseFacts) -> None:
    missing = [name for name in GAUGES if name not in facts.metrics]
    assert not missing, f"SGLang {facts.version} exports none of {missing}"
    assert {"pp_rank", "tp_rank", "model_name"} <= set(facts.scheduler_labels)
    assert facts.metrics["sglang:num_retracted_requests_total"]["type"] == "counter"


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_every_variable_the_adapter_sets_is_read_by_the_release(facts: ReleaseFacts) -> None:
    assert [v for v in ENV_USED if v not in facts.env] == []


# 0.5.3 is below the range but recorded: the release before the 0.5.4 and 0.5.7 thresholds
WITH_0_5_3 = [ReleaseFacts.load("0.5.3"), *SUPPORTED]


@pytest.mark.parametrize("facts", WITH_0_5_3, ids=_ids(WITH_0_5_3))
def test_every_spelling_is_in_range_exactly_where_the_release_has_it(facts: ReleaseFacts) -> None:
    # versions.py's thresholds (what decides where no flag set is at hand) against each recorded parser
    v = parse_version(facts.version)
    wrong = {s.flag: f"in range: {s.in_range(v)}, in the flag set: {s.flag in facts.flags}"
             for spellings in RENAMES.values() for s in spellings if s.in_range(v) != (s.flag in facts.flags)}
    assert not wrong, f"SGLang {facts.version}: {wrong}"


def test_each_threshold_sits_between_two_recorded_releases() -> None:
    # with the test above: the newest recorded release below a threshold lacks the spelling's change and
    # the oldest at or above it has it; inside the supported range that oldest one is the threshold itself
    recorded = sorted(parse_version(f.version) for f in WITH_0_5_3)
    thresholds = {t for spellings in RENAMES.values() for s in spellings for t in (s.since, s.until)
                  if t not in (None, (0,))}
    for t in thresholds:
        below = [r for r in recorded if r < t]
        above = [r for r in recorded if r >= t]
        assert below and above, t
        if t >= parse_version(OLDEST_SUPPORTED):
            assert above[0] == t, t


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_the_context_length_gauge_is_exported_from_0_5_11(facts: ReleaseFacts) -> None:
    # 0.5.10 has no sglang:context_len; the 0.5.11 wheel (read, not recorded) and every later one has
    assert ("sglang:context_len" in facts.metrics) == (parse_version(facts.version) >= (0, 5, 11))


def _conf(model: str, hardware: str, tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1, attention: int = 1,
          **extra: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sglang"
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware(hardware)
    cfg.tp.size, cfg.pp.size, cfg.ep.size, cfg.dp.size, cfg.dp.attention = tp, pp, ep, dp, attention
    cfg.server.extra_args = dict(extra)
    return cfg


def _expert_layout() -> ParasweepConf:
    cfg = _conf("deepseek-v3", "h200-nvlink-x8", tp=8, ep=8, attention=8)
    cfg.ep.a2a_backend, cfg.ep.deepep_mode, cfg.ep.eplb = "deepep", "low_latency", True
    cfg.ep.redundant_experts, cfg.ep.two_batch_overlap = 32, True
    cfg.dp.router = "total_requests"
    return cfg


LAYOUTS = {
    "TP8": _conf("llama-3.1-70b", "h100-sxm-x8", tp=8),
    "PP8": _conf("kimi-k2", "rtx-pro-6000-pcie-x8", pp=8),
    "EP8": _conf("kimi-k2", "h200-nvlink-x8", tp=8, ep=8),
    "DP2xTP4": _conf("llama-3.1-70b", "h100-sxm-x8", tp=4, dp=2),
    "attention DP": _conf("kimi-k2", "h200-nvlink-x8", tp=8, attention=8),
    "attention DP with DeepEP, EPLB, redundant experts, two-batch overlap": _expert_layout(),
    # old names of renamed flags, spelt per release
    "renamed extra args": _conf("llama-3.1-8b", "h100-sxm-x8", tp=2, cuda_graph_max_bs=64,
                                cuda_graph_bs=[1, 2], stream_output=True),
}


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_build_argv_every_supported_release_accepts(facts: ReleaseFacts, layout: str) -> None:
    args = check_args(build_args(LAYOUTS[layout], 30000, facts.version, facts.flags), facts.flags,
                      facts.version)
    argv = args_to_argv(args)
    assert all(facts.flags.dest(a) for a in argv if a.startswith("--"))  # exact flags of that release
    # without a flag set (the simulated engine, a plan where SGLang is absent) the version thresholds
    # of versions.py choose each spelling: they must choose what the release's own parser has
    assert args_to_argv(build_args(LAYOUTS[layout], 30000, facts.version)) == argv
    if layout == "attention DP":  # spelt per release: --attn-dp-size from 0.5.22, before as DP groups
        expected = ["--attn-dp-size", "8"] if "--attn-dp-size" in facts.flags else ["--dp-size", "8"]
        assert argv[argv.index(expected[0]):argv.index(expected[0]) + 2] == expected
        assert ("--enable-dp-attention" in argv) == ("--attn-dp-size" not in facts.flags)
    if layout.startswith("attention DP with"):  # every key its own flag, on every release
        for flag in ("--moe-a2a-backend", "--deepep-mode", "--enable-eplb", "--ep-num-redundant-experts",
                     "--enable-two-batch-overlap", "--load-balance-method"):
            assert flag in argv, flag


@pytest.mark.parametrize(("cfg", "key", "why"), [
    # SGLang 0.5.23 parallel_hook.py: "data-parallel replicas combined with attention data parallelism
    # are not supported"
    (_conf("kimi-k2", "h200-nvlink-x8", tp=4, dp=2, attention=2), "dp.attention",
     "replicas combined with attention data parallelism"),
    # assert cfg.tp_size % cfg.attn_dp_size == 0
    (_conf("kimi-k2", "h200-nvlink-x8", tp=8, attention=3), "dp.attention", "tp_size % attn_dp_size"),
    (_conf("kimi-k2", "h200-nvlink-x8", tp=8, attention=0), "dp.attention", "positive"),
    # validation_hook.py / server_args.py: served_model_name cannot contain a colon
    (_conf("llama-3.1-8b", "h100-sxm-x8"), "model.name", "':'"),
])
def test_layouts_sglang_refuses_are_refused_in_one_line(cfg: ParasweepConf, key: str, why: str) -> None:
    if key == "model.name":
        cfg.model.name = "llama:8b"
    for facts in SUPPORTED:
        with pytest.raises(ConfigError) as err:
            build_args(cfg, 30000, facts.version, facts.flags)
        message = str(err.value)
        assert message.startswith(f"{key}=") and "\n" not in message and why in message, message


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_the_checks_mirrored_are_the_releases_own(facts: ReleaseFacts) -> None:
    # the refusals above stand for these lines of each release's source (recorded under "checks"):
    # server_args.py up to 0.5.16 (self.), the argument hooks from 0.5.19 on (cfg.)
    checks = " ".join(c["source"] for c in release_record(facts.version)["checks"])
    assert re.search(r'assert ":" not in (self|cfg)\.served_model_name', checks)
    if "--attn-dp-size" in facts.flags:
        assert "assert cfg.tp_size % cfg.attn_dp_size == 0" in checks
        assert "if cfg.attn_dp_size > 1 and cfg.dp_size > 1: raise ValueError(" in checks
        assert "if cfg.attn_dp_size < 1: raise ValueError(" in checks
    else:  # --enable-dp-attention makes --dp-size the attention-DP group count, within the TP group
        assert re.search(r"assert (self|cfg)\.tp_size % (self|cfg)\.dp_size == 0", checks)


@pytest.mark.slow  # starts the script
def test_the_first_gpu_node_script_skips_in_one_line_without_a_gpu(tmp_path: Path) -> None:
    from orchestrator.gpus import local_gpu_count

    if local_gpu_count() > 0:
        pytest.skip("this machine has a GPU: the script would run for real")
    out = subprocess.run([str(ROOT / "scripts" / "gpu_first_node.sh")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False,
                         env={**os.environ, "PARASWEEP_PYTHON": sys.executable,
                              "OUT_DIR": str(tmp_path / "o")})
    assert out.returncode == 0, out
    assert out.stdout.strip().splitlines() == ["gpu_first_node: SKIP: no GPU visible to NVML on this machine"]
    assert not (tmp_path / "o").exists()  # nothing run, nothing written


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_the_prefix_cache_keys_are_flags_each_release_takes(facts: ReleaseFacts) -> None:
    cfg = _conf("llama-3.1-8b", "h100-sxm-x8")
    cfg.server.radix_cache, cfg.server.schedule_policy = False, "lpm"
    argv = args_to_argv(check_args(build_args(cfg, 30000, facts.version, facts.flags), facts.flags,
                                   facts.version))
    assert "--disable-radix-cache" in argv and argv[argv.index("--schedule-policy") + 1] == "lpm"
    # the newer policies only where the release's choices list them (0.5.20: hrrn; 0.5.22: shortest-
    # prefill-first)
    for policy, since in (("hrrn", (0, 5, 20)), ("shortest-prefill-first", (0, 5, 22))):
        cfg.server.radix_cache, cfg.server.schedule_policy = True, policy
        if parse_version(facts.version) >= since:
            assert policy in args_to_argv(build_args(cfg, 30000, facts.version, facts.flags))
        else:
            with pytest.raises(ConfigError) as err:
                build_args(cfg, 30000, facts.version, facts.flags)
            assert f"is new in SGLang {'.'.join(map(str, since))}" in str(err.value)


@pytest.mark.parametrize("facts", SUPPORTED, ids=_ids(SUPPORTED))
def test_the_all_to_all_backends_are_each_releases_own(facts: ReleaseFacts) -> None:
    """``ep.a2a_backend`` is checked against the choices the release's own parser lists (read from its
    source): DeepEP everywhere it has the flag, NIXL only from 0.5.10."""
    choices = facts.flags.choices.get("--moe-a2a-backend")
    assert choices is not None and "deepep" in choices and choices[0] == "none"
    for backend in ("deepep", "nixl", "nccl"):
        cfg = _conf("deepseek-v3", "h200-nvlink-x8", tp=8, ep=8, attention=8)
        cfg.ep.a2a_backend = backend
        if backend in choices:
            argv = args_to_argv(check_args(build_args(cfg, 30000, facts.version, facts.flags), facts.flags,
                                           facts.version))
            assert argv[argv.index("--moe-a2a-backend") + 1] == backend
            continue
        with pytest.raises(ConfigError) as err:
            check_args(build_args(cfg, 30000, facts.version, facts.flags), facts.flags, facts.version)
        message = str(err.value)
        assert message.startswith(f"ep.a2a_backend={backend}: invalid") and ", ".join(choices) in message
    assert ("nixl" in choices) == (parse_version(facts.version) >= (0, 5, 10))
