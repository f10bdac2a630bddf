"""SGLang command builder: exact argv per parallel layout, per-version flag spellings, and the preflight
against a version's flag set (SGLang 0.5.23's recorded parser; the real parser where it is installed)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.base import sglang_flags
from orchestrator.engines.registry import get_engine
from orchestrator.engines.sglang_compat import (
    FlagSet,
    SGLangTarget,
    build_args,
    detect,
    flags_from_help,
    recorded_flag_set,
)
from orchestrator.engines.sglang_compat.versions import ReleaseFacts
from orchestrator.errors import ConfigError, UserError
from vocab.assets import model_dir

DATA = Path(__file__).parent / "data" / "sglang"
RECORDED = recorded_flag_set("0.5.23")
T0523 = SGLangTarget("0.5.23", RECORDED, True, "python")
PORT = 30123


def conf(**sizes: int) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.model.name, cfg.model.path = "llama-3.1-8b", "models/llama-3.1-8b"
    cfg.tp.size, cfg.pp.size = sizes.get("tp", 1), sizes.get("pp", 1)
    cfg.ep.size, cfg.dp.size = sizes.get("ep", 1), sizes.get("dp", 1)
    return cfg


def head(tp: int, pp: int, ep: int, dp: int) -> list[str]:
    return ["--model-path", str(model_dir("models/llama-3.1-8b")), "--served-model-name", "llama-3.1-8b",
            "--load-format", "dummy", "--tp-size", str(tp), "--pp-size", str(pp), "--ep-size", str(ep),
            "--dp-size", str(dp), "--skip-tokenizer-init"]


def tail(interval: int) -> list[str]:
    return ["--enable-metrics", "--decode-log-interval", str(interval), "--random-seed", "0",
            "--host", "127.0.0.1", "--port", str(PORT)]


def _layouts() -> dict[str, tuple[ParasweepConf, list[str]]]:
    tp8 = conf(tp=8)
    pp8_d0 = conf(pp=8)
    pp8_d0.pp.micro_batch_size = 16
    pp8_d8 = conf(pp=8)
    pp8_d8.pp.async_depth, pp8_d8.pp.micro_batch_size = 8, 4
    ep8 = conf(tp=8, ep=8)
    dp2tp4 = conf(tp=4, dp=2)
    dp2tp4.server.max_running_requests = 256
    dp2tp4.server.cuda_graph = False
    return {
        "tp8": (tp8, head(8, 1, 1, 1) + tail(40)),
        # loop of 8 slots: 40 shares a factor with 8, so 41
        "pp8_depth0": (pp8_d0, [*head(1, 8, 1, 1), "--pp-async-batch-depth", "0",
                                "--pp-max-micro-batch-size", "16", *tail(41)]),
        # loop of 16 slots: 41 again
        "pp8_depth8": (pp8_d8, [*head(1, 8, 1, 1), "--pp-async-batch-depth", "8",
                                "--pp-max-micro-batch-size", "4", *tail(41)]),
        "ep8": (ep8, head(8, 1, 8, 1) + tail(40)),
        "dp2tp4": (dp2tp4, [*head(4, 1, 1, 2), "--max-running-requests", "256", "--disable-cuda-graph",
                            *tail(40)]),
    }


LAYOUTS = _layouts()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_argv_per_layout(name: str) -> None:
    cfg, expected = LAYOUTS[name]
    assert sglang_flags(cfg, PORT, T0523) == expected
    assert sglang_flags(cfg, PORT) == expected  # unchecked (simulated engine): the same spellings


def _emitted_flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_flag_is_a_full_name_in_0_5_23(name: str) -> None:
    cfg, _ = LAYOUTS[name]
    cfg.server.extra_args = {"cuda_graph_max_bs": 64, "enable_cache_report": True}
    cfg.server.schedule_policy, cfg.server.radix_cache = "lpm", False
    argv = sglang_flags(cfg, PORT, T0523)
    help_flags = flags_from_help((DATA / "help-0.5.23.txt").read_text(), "0.5.23")
    for flag in _emitted_flags(argv):
        assert flag in RECORDED.options, flag  # exact option string: never an abbreviation
        assert flag in help_flags.options, flag  # and visible in that version's --help
    assert "--cuda-graph-max-bs-decode" in argv  # the renamed flag, not the 0.5.23 ambiguous prefix


def test_recorded_help_matches_recorded_parser() -> None:
    """The two recordings of 0.5.23 agree: --help lists every parser option except help-suppressed ones."""
    from_help = flags_from_help((DATA / "help-0.5.23.txt").read_text(), "0.5.23")
    assert set(from_help.options) <= set(RECORDED.options)
    assert len(set(RECORDED.options) - set(from_help.options)) <= 2
    assert from_help.takes_value["--tp-size"] and not from_help.takes_value["--enable-metrics"]
    assert RECORDED.dest("--tensor-parallel-size") == "tp_size"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed here")
def test_flags_parse_with_installed_sglang_parser() -> None:  # pragma: no cover - needs SGLang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    for cfg, _ in LAYOUTS.values():
        parser.parse_args(sglang_flags(cfg, PORT, T0523))


_BARE = ("--skip-tokenizer-init", "--enable-metrics", "--disable-cuda-graph", "--enable-dp-attention",
         "--stream-output")


def _fake(version: str, flags: list[str]) -> FlagSet:
    return FlagSet(version, {f: f.lstrip("-").replace("-", "_") for f in flags},
                   {f: f not in _BARE for f in flags})


_COMMON = ["--model-path", "--served-model-name", "--load-format", "--tp-size", "--pp-size", "--ep-size",
           "--dp-size", "--skip-tokenizer-init", "--enable-metrics", "--decode-log-interval", "--random-seed",
           "--host", "--port", "--max-running-requests", "--disable-cuda-graph", "--enable-dp-attention",
           "--json-model-override-args"]


def test_micro_batch_flag_renamed_in_0_5_4() -> None:
    cfg = conf(pp=4)
    cfg.pp.micro_batch_size = 8
    old = sglang_flags(cfg, PORT, SGLangTarget("0.5.3", _fake("0.5.3", [*_COMMON, "--max-micro-batch-size"]),
                                               True, "python"))
    assert old[old.index("--max-micro-batch-size") + 1] == "8"
    assert "--pp-async-batch-depth" not in old  # depth 0 on a version without the flag: left out
    by_version = [a.flag for a in build_args(cfg, PORT, "0.5.3")]
    assert "--max-micro-batch-size" in by_version and "--pp-max-micro-batch-size" not in by_version
    assert "--pp-max-micro-batch-size" in [a.flag for a in build_args(cfg, PORT, "0.5.4")]


def test_async_depth_before_0_5_7_is_a_clear_error() -> None:
    cfg = conf(pp=4)
    cfg.pp.async_depth = 8
    with pytest.raises(ConfigError) as err:
        sglang_flags(cfg, PORT, SGLangTarget("0.5.6", _fake("0.5.6", [*_COMMON, "--pp-max-micro-batch-size"]),
                                             True, "python"))
    message = str(err.value)
    assert message.startswith("pp.async_depth=8: invalid") and "0.5.7" in message and "0.5.6" in message
    assert "\n" not in message


def test_renamed_extra_args_follow_the_version() -> None:
    cfg = conf(tp=2)
    cfg.server.extra_args = {"cuda_graph_max_bs": 96, "stream_output": True}
    old = sglang_flags(cfg, PORT, SGLangTarget(
        "0.5.9", _fake("0.5.9", [*_COMMON, "--cuda-graph-max-bs", "--stream-output"]), True, "python"))
    assert old[-3:] == ["--cuda-graph-max-bs", "96", "--stream-output"]
    new = sglang_flags(cfg, PORT, T0523)
    assert new[-3:] == ["--cuda-graph-max-bs-decode", "96", "--incremental-streaming-output"]


def test_attention_dp_spelling_per_version() -> None:
    cfg = conf(tp=8)
    cfg.dp.attention = 8
    new = sglang_flags(cfg, PORT, T0523)
    assert new[new.index("--attn-dp-size") + 1] == "8" and new[new.index("--dp-size") + 1] == "1"
    old = sglang_flags(cfg, PORT, SGLangTarget("0.5.9", _fake("0.5.9", _COMMON), True, "python"))
    assert old[old.index("--dp-size") + 1] == "8" and "--enable-dp-attention" in old
    assert "--attn-dp-size" not in old
    cfg.dp.size = 2
    with pytest.raises(ConfigError, match=r"^dp\.attention=8: invalid"):
        sglang_flags(cfg, PORT, SGLangTarget("0.5.9", _fake("0.5.9", _COMMON), True, "python"))
    cfg.dp.size = 1
    # the flags parasweep sets from its keys are refused as extra args, with the key to use
    for name, key in (("enable_dp_attention", "dp.attention"), ("attn_dp_size", "dp.attention"),
                      ("moe_a2a_backend", "ep.a2a_backend"), ("enable_eplb", "ep.eplb")):
        cfg.server.extra_args = {name: True if name.startswith("enable") else 8}
        with pytest.raises(ConfigError, match=f"set it with {key}"):
            sglang_flags(cfg, PORT, T0523)


def test_unknown_abbreviated_and_duplicate_flags_are_refused() -> None:
    cfg = conf(tp=2)
    cfg.server.extra_args = {"bogus_flag": 1}
    with pytest.raises(ConfigError) as err:
        sglang_flags(cfg, PORT, T0523)
    assert "--bogus-flag is not a flag of SGLang 0.5.23" in str(err.value)
    assert str(err.value).startswith("server.extra_args.bogus_flag=1: invalid")
    cfg.server.extra_args = {"--tp": 4}
    with pytest.raises(ConfigError, match="abbreviation of --tp-size"):
        sglang_flags(cfg, PORT, T0523)
    cfg.server.extra_args = {"tensor_parallel_size": 4}
    with pytest.raises(ConfigError, match=r"set it with tp\.size"):
        sglang_flags(cfg, PORT, T0523)
    cfg.server.extra_args = {"enable_metrics_for_all_schedulers": 3}
    with pytest.raises(ConfigError, match="takes no value"):
        sglang_flags(cfg, PORT, T0523)
    cfg.server.extra_args = {"schedule_policy": "lpm"}
    with pytest.raises(ConfigError, match=r"set it with server\.schedule_policy"):
        sglang_flags(cfg, PORT, T0523)
    cfg.server.extra_args = {"host": "0.0.0.0", "schedule_policy": None, "sleep_on_idle": False}
    argv = sglang_flags(cfg, PORT, T0523)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "--schedule-policy" not in argv and "--sleep-on-idle" not in argv


def test_model_override_args_become_json() -> None:
    cfg = conf(tp=1)
    cfg.model.override_args = {"num_hidden_layers": 2, "vocab_size": 1024}  # type: ignore[attr-defined]
    argv = sglang_flags(cfg, PORT, T0523)
    assert json.loads(argv[argv.index("--json-model-override-args") + 1]) == {
        "num_hidden_layers": 2, "vocab_size": 1024}


def test_sim_engine_applies_override_args_to_a_config_copy(tmp_path: Path) -> None:
    cfg = conf(tp=1)
    cfg.model.path = "models/tiny-test"
    cfg.model.override_args = {"num_hidden_layers": 2}  # type: ignore[attr-defined]
    engine = get_engine("sim")
    argv = engine.argv(cfg, PORT, tmp_path)
    assert "--json-model-override-args" not in argv
    engine.prepare(cfg, tmp_path)
    copied = Path(argv[argv.index("--model-path") + 1])
    assert json.loads((copied / "config.json").read_text())["num_hidden_layers"] == 2


# ---- preflight against an installed SGLang: a stub package run by a real interpreter subprocess

_STUB_ARGS = """
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        for flag in FLAGS:
            if flag in BARE:
                parser.add_argument(flag, action="store_true")
            else:
                parser.add_argument(flag)
"""


def _stub_python(tmp_path: Path, version: str, flags: list[str]) -> str:
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "server_args.py").write_text(f"FLAGS = {flags!r}\nBARE = {list(_BARE)!r}\n" + _STUB_ARGS)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)


def test_preflight_reads_installed_version_and_caches_its_flags(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARASWEEP_CACHE_DIR", str(tmp_path / "cache"))
    python = _stub_python(tmp_path, "0.5.9", [*_COMMON, "--pp-max-micro-batch-size"])
    cfg = conf(pp=2)
    cfg.engine.python = python
    cfg.pp.micro_batch_size = 4
    engine = get_engine("sglang")
    argv = engine.argv(cfg, PORT, tmp_path)
    assert argv[:3] == [python, "-m", "sglang.launch_server"]
    assert "--pp-async-batch-depth" not in argv and "--pp-max-micro-batch-size" in argv
    assert engine.plan_notes(cfg) == [f"sglang 0.5.9 ({python}); flags checked against its parser"]
    cached = json.loads((tmp_path / "cache" / "sglang-flags-0.5.9.json").read_text())
    assert cached["sglang_version"] == "0.5.9"
    cfg.pp.async_depth = 8  # the stub's parser lacks the flag: refused by the installed flag set
    with pytest.raises(ConfigError, match=r"^pp\.async_depth=8: invalid .*0\.5\.7"):
        engine.preflight(cfg)
    detect._TARGETS.pop(python)


def test_the_flag_cache_keeps_whether_each_option_string_takes_a_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.5.16: --disable-piecewise-cuda-graph, --enable-breakable-cuda-graph and
    # --enforce-piecewise-cuda-graph take no value but store into the dest of --cuda-graph-backend-prefill,
    # which takes one; the cached flag set must say so per option string, as the parser did
    monkeypatch.setenv("PARASWEEP_CACHE_DIR", str(tmp_path / "cache"))
    parsed = ReleaseFacts.load("0.5.16").flags
    monkeypatch.setattr(detect, "_probe_flags", lambda python, version: parsed)
    # a cache written before the format kept this per option string (one action per dest) is probed again
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "sglang-flags-0.5.16.json").write_text(json.dumps(
        {"sglang_version": "0.5.16", "how": "parser", "actions": [
            {"options": ["--cuda-graph-backend-prefill", "--disable-piecewise-cuda-graph"],
             "dest": "cuda_graph_backend_prefill", "takes_value": True}]}))
    cfg = conf(pp=8)
    cfg.server.extra_args = {"disable_piecewise_cuda_graph": True}
    for read in ("probed", "cached"):
        flags = detect.flag_set("python", "0.5.16")
        assert flags.source.startswith("cached") == (read == "cached")
        argv = sglang_flags(cfg, PORT, SGLangTarget("0.5.16", flags, True, "python"))
        assert argv[-1] == "--disable-piecewise-cuda-graph", read
        assert flags.takes_value == parsed.takes_value, read


def test_a_release_older_than_the_supported_range_is_refused(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARASWEEP_CACHE_DIR", str(tmp_path / "cache"))
    python = _stub_python(tmp_path, "0.5.3", _COMMON)
    cfg = conf()
    cfg.engine.python = python
    with pytest.raises(UserError) as err:
        get_engine("sglang").preflight(cfg)
    message = str(err.value)
    assert "\n" not in message and "SGLang 0.5.3" in message and "sglang>=0.5.9" in message
    assert not (tmp_path / "cache").exists()  # nothing probed or cached for a release never launched


def test_preflight_without_sglang_falls_back_to_recorded_flags(tmp_path: Path) -> None:
    site = tmp_path / "empty"
    site.mkdir()
    python = tmp_path / "python"
    # -I: isolated, so no sglang from this environment's site-packages leaks in
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -I \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    cfg = conf(tp=8)
    cfg.engine.python = str(python)
    engine = get_engine("sglang")
    notes = engine.preflight(cfg)
    assert notes == [f"sglang: not installed for {python}; argv built for SGLang 0.5.23 and checked "
                     "against its recorded flag set"]
    cfg.server.extra_args = {"bogus": True}
    with pytest.raises(UserError, match=r"--bogus is not a flag of SGLang 0\.5\.23"):
        engine.preflight(cfg)
    detect._TARGETS.pop(str(python))


def test_missing_interpreter_is_a_config_error(tmp_path: Path) -> None:
    cfg = conf()
    cfg.engine.python = str(tmp_path / "nope" / "python")
    with pytest.raises(ConfigError, match=r"^engine\.python=.*no such executable"):
        get_engine("sglang").preflight(cfg)


def test_broken_sglang_install_is_a_user_error(tmp_path: Path) -> None:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(UserError, match="import sglang` failed: ImportError: libcuda"):
        detect.installed_version(str(python))
    assert os.access(python, os.X_OK)
