"""SGLang log parsing across versions: batch lines (fixtures per version), startup lines -> resolved
configuration, merged with /server_info."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from orchestrator.engines.sglang_compat.versions import RECORDED, parse_version
from orchestrator.telemetry.server_log import (
    merge_resolved,
    parse_log_line,
    parse_log_lines,
    resolved_from_startup_log,
    resolved_params,
    server_log_frame,
    stage_series,
)
from tests.sglang_render import fixed_text, format_strings, matches_a_format, render

DATA = Path(__file__).parent / "data" / "sglang"
CASES = yaml.safe_load((DATA / "batch-lines.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['version']}:{i}" for i, c in enumerate(CASES)])
def test_batch_line_fixture(case: dict) -> None:
    row = parse_log_line(case["line"])
    expect = case["expect"]
    if expect is None:
        assert row is None
        return
    assert row is not None
    expect = dict(expect)
    fraction = expect.pop("ts_fraction", 0.0)
    for key, value in expect.items():
        assert row.get(key) == pytest.approx(value) if isinstance(value, float) else row.get(key) == value, (
            key, row)
        assert type(row.get(key)) is type(value), (key, row)
    stamp = case["line"][1:20]
    assert row["ts"] == pytest.approx(time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + fraction)


def test_parse_log_lines_skips_unrelated_and_keeps_order() -> None:
    rows = parse_log_lines(c["line"] for c in CASES)
    assert len(rows) == sum(c["expect"] is not None for c in CASES)
    assert [r["kind"] for r in rows[:3]] == ["decode", "decode", "prefill"]


def test_server_log_frame_and_stage_series(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "[2026-05-02 09:00:00] The server is fired up and ready to roll!",
        "[2026-05-02 09:00:01 PP0] Decode batch, #running-req: 4, #token: 10, token usage: 0.01, "
        "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0",
        "[2026-05-02 09:00:01 PP1] Decode batch, #running-req: 3, #token: 10, token usage: 0.01, "
        "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0",
        "[2026-05-02 09:00:02 PP0] Decode batch, #running-req: 5, #token: 12, token usage: 0.01, "
        "cuda graph: False, gen throughput (token/s): 120.00, #queue-req: 2",
        "garbage \x00 line",
    ]) + "\n")
    frame = server_log_frame(log)
    assert list(frame.columns[:7]) == ["ts", "kind", "iter", "dp", "pp", "tp", "ep"]
    assert len(frame) == 3
    series = stage_series(frame, "running_req")
    assert sorted(series) == ["PP0", "PP1"]
    assert series["PP0"].tolist() == [4, 5] and series["PP1"].tolist() == [3]
    assert stage_series(frame, "cuda_graph")["PP0"].tolist() == [True, False]
    assert stage_series(frame, "running_req", kind="prefill") == {}
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert server_log_frame(empty).empty


def test_startup_log_0_5_23_pp2() -> None:
    r = resolved_from_startup_log((DATA / "startup-0.5.23.log").read_text())
    assert r["max_total_num_tokens"] == 812345
    assert r["max_running_requests"] == 64
    assert r["chunked_prefill_size"] == 8192 and r["max_prefill_tokens"] == 16384
    assert r["context_len"] == 131072
    assert r["available_gpu_mem_gb"] == pytest.approx(17.4)  # min over stages
    assert r["available_gpu_mem_gb_by_stage"] == {"PP0": 18.9, "PP1": 17.4}
    assert "max_running_requests_by_stage" not in r  # stages agree
    assert r["cuda_graph_bs_decode"] == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
    assert r["cuda_graph_max_bs_decode_captured"] == 64
    assert r["attention_backend"] == "fa3"
    assert r["disable_overlap_schedule"] is True
    assert r["cuda_graph_backend_prefill"] == "disabled"
    assert r["kv_cache_tokens"] == 812345 and r["kv_cache_dtype"] == "torch.bfloat16"
    assert r["weight_mem_gb_max"] == pytest.approx(9.0)
    assert r["ready_logged"] is True


# ---- start-up lines rendered from each release's own format strings (tests/sglang_render.py)

STAMP = "[2026-12-01 10:00:00.123 TP0] "  # SGLang's prefix with SGLANG_LOG_MS=1 (0.5.9 and 0.5.23)
# placeholders whose expression is long, by the release's own source text
MEM_KIND = "'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'"
KV_PHASE = "'VA upper bound' if self.post_capture_active else 'is allocated'"
GRAPH_KIND = "graph_backend[model_runner.device]"


def _line(version: str, anchor: str, values: dict[str, object] | None = None,
          percent: tuple[object, ...] = (), file: str = "") -> str:
    found = format_strings(version, anchor, file)
    assert found, f"SGLang {version} has no log line with {anchor!r}"
    return STAMP + render(found[0], values, percent)


def test_startup_facts_from_0_5_9s_own_format_strings() -> None:
    v = "0.5.9"
    lines = [
        _line(v, "backend by default", {"self.attention_backend": "flashinfer"}),
        _line(v, "Load weight end", {"time.perf_counter() - tic_total": 3.2, "type(self.model).__name__":
                                     "LlamaForCausalLM", "self.dtype": "torch.bfloat16",
                                     "after_avail_memory": 60.1, "self.weight_load_mem_usage": 15.02}),
        _line(v, "#tokens: {}, K size", {"num_tokens": 350000, "k_size_GB": 20.0, "v_size_GB": 20.0}),
        _line(v, "Capture cuda graph bs", {"self.capture_bs": [1, 2, 4, 8, 12, 16, 24, 32]}),
        _line(v, "The expert parallel size is adjusted", {"self.tp_size": 8}, file="server_args.py"),
        _line(v, "max_prefill_tokens=", {"self.max_total_num_tokens": 350000,
                                         "self.server_args.chunked_prefill_size": 8192,
                                         "self.max_prefill_tokens": 16384, "self.max_running_requests": 2048,
                                         "self.model_config.context_len": 131072,
                                         MEM_KIND: "available_gpu_mem", "avail_mem": 18.5},
              file="scheduler.py"),
        _line(v, "fired up and ready to roll"),
    ]
    r = resolved_from_startup_log("\n".join(lines))
    assert r["attention_backend"] == "flashinfer" and r["weight_mem_gb_max"] == pytest.approx(15.02)
    assert r["kv_cache_tokens"] == 350000 and "kv_cache_dtype" not in r  # 0.5.9 does not log the dtype
    assert r["cuda_graph_bs_decode"] == [1, 2, 4, 8, 12, 16, 24, 32]
    assert r["ep_size"] == 8 and "ep_size_requested" not in r  # 0.5.9 does not say what was asked for
    assert r["max_running_requests"] == 2048 and r["max_total_num_tokens"] == 350000
    assert r["available_gpu_mem_gb"] == pytest.approx(18.5) and r["ready_logged"] is True
    # 0.5.9 never says that it lowered max_running_requests: only /server_info's internal state can
    assert format_strings(v, "max_running_requests was reduced") == []


def test_startup_facts_from_0_5_23s_own_format_strings() -> None:
    v = "0.5.23"
    lines = [
        _line(v, "backend by default", {"backend": "fa3"}),
        _line(v, "#tokens: {}, K size", {"cache_name": "KV Cache", "self.dtype": "torch.bfloat16",
                                         KV_PHASE: "is allocated", "num_tokens": 812345, "k_size_GB": 9.5,
                                         "v_size_GB": 9.5}),
        _line(v, "end. bs=", {"capture_name": "target decode", GRAPH_KIND: "CUDA graph",
                              "runner.capture_bs": [1, 2, 4, 8, 16, 32, 64], "capture_time": 14.0,
                              "memory_usage_gb": 1.2, "after_mem": 18.9}),
        _line(v, "is adjusted from", {"view.moe_a2a_backend": "deepep", "view.ep_size": 1,
                                      "view.tp_size": 8}),
        _line(v, "reduced from the requested", percent=(4096, 2048), file="kv_cache_configurator.py"),
        _line(v, "incompatible with overlap schedule"),
        _line(v, "breakable prefill CUDA graph by default"),
    ]
    r = resolved_from_startup_log("\n".join(lines))
    assert r["attention_backend"] == "fa3" and r["disable_overlap_schedule"] is True
    assert r["kv_cache_tokens"] == 812345 and r["kv_cache_dtype"] == "torch.bfloat16"
    assert r["cuda_graph_bs_decode"] == [1, 2, 4, 8, 16, 32, 64]
    assert r["cuda_graph_max_bs_decode_captured"] == 64
    assert (r["ep_size_requested"], r["ep_size"]) == (1, 8)
    assert r["max_running_requests_requested"] == 4096
    assert r["cuda_graph_backend_prefill"] == "disabled"
    # with KV sized after CUDA-graph capture, the pool line reads "VA upper bound" (address space
    # reserved, not the pool) and the pool's size follows in its own line
    upper = _line(v, "#tokens: {}, K size", {"cache_name": "KV Cache", "self.dtype": "torch.bfloat16",
                                             KV_PHASE: "VA upper bound", "num_tokens": 900000,
                                             "k_size_GB": 9.9, "v_size_GB": 9.9})
    assert "kv_cache_tokens" not in resolved_from_startup_log(upper)
    sized = _line(v, "Post-capture KV sizing: KV cache allocated",
                  percent=("torch.bfloat16", 700000, 15.2, 3.1))
    r = resolved_from_startup_log("\n".join([upper, sized]))
    assert r["kv_cache_tokens"] == 700000 and r["kv_cache_dtype"] == "torch.bfloat16"


# The decode CUDA-graph capture line that lists the batch sizes, by the fixed text of its format string
# and its file, and the releases that print it (each recorded release prints exactly one of them)
DECODE_CAPTURE = [
    ("Capture cuda graph bs ", "model_executor/cuda_graph_runner.py"),  # 0.5.9 to 0.5.13
    # the "begin" line, in ModelRunner (0.5.14, 0.5.15) and then capture_decode_graph of
    # model_runner_components/cuda_graph_setup.py (0.5.16 to 0.5.21); their "end" line has no sizes
    ("num_tokens_per_bs={}, bs={}", "model_executor/model_runner.py"),
    ("num_tokens_per_req={}, bs={}", "model_runner_components/cuda_graph_setup.py"),
    ("end. bs={}", "model_runner_components/cuda_graph_setup.py"),  # 0.5.22 and later: the "end" line
]
CAPTURED = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]
CAPTURE_VALUES: dict[str, object] = {
    "self.capture_bs": CAPTURED, "capture_bs": CAPTURED, "runner.capture_bs": CAPTURED,
    "capture_name": "target decode", GRAPH_KIND: "CUDA graph", "graph_backend[self.device]": "CUDA graph",
    "decode_backend": "full", "num_tokens_per_bs": 1, "num_tokens_per_req": 1, "self.topk": 4,
    "before_mem": 31.25, "capture_time": 14.0, "memory_usage_gb": 1.2, "after_mem": 30.05}


@pytest.mark.parametrize("version", RECORDED)
def test_decode_capture_sizes_from_each_releases_own_line(version: str) -> None:
    printed = [(text, file) for text, file in DECODE_CAPTURE if format_strings(version, text, file)]
    assert len(printed) == 1, printed
    text, file = printed[0]
    r = resolved_from_startup_log(_line(version, text, CAPTURE_VALUES, file=file))
    assert r["cuda_graph_bs_decode"] == CAPTURED and r["cuda_graph_max_bs_decode_captured"] == 64
    # a speculative draft model's capture (its own "Capture draft decode ..." line) is not the target's
    for draft in format_strings(version, "Capture draft decode CUDA graph begin.", "eagle_worker_v2.py"):
        assert "cuda_graph_bs_decode" not in resolved_from_startup_log(STAMP + render(draft, CAPTURE_VALUES))


@pytest.mark.parametrize("version", RECORDED)
def test_which_releases_log_the_lowered_request_cap_and_the_pp_prefill_graph(version: str) -> None:
    # docs/sglang-adapter.md, "Startup lines the parser reads": the two lines appear in 0.5.14 and 0.5.19
    v = parse_version(version)
    assert bool(format_strings(version, "max_running_requests was reduced from the requested")) == (
        v >= (0, 5, 14))
    pp_prefill = "Disabling breakable prefill CUDA graph by default for pipeline"
    assert bool(format_strings(version, pp_prefill)) == (v >= (0, 5, 19))


def test_merge_resolved_prefers_server_info_and_internal_states() -> None:
    startup = resolved_from_startup_log((DATA / "startup-0.5.23.log").read_text())
    # the shape of 0.5.23's /server_info: inputs left unset read null at the top level; the
    # scheduler's copy of the arguments (internal_states) carries what it set at start-up, and the
    # resolved CUDA-graph size is nested in cuda_graph_config
    info = {"max_running_requests": None, "pp_size": 2, "attention_backend": "fa3", "tp_size": 2,
            "chunked_prefill_size": 8192, "pp_max_micro_batch_size": None, "version": "0.5.23",
            "cuda_graph_max_bs_decode": None, "cuda_graph_config": {"decode": {"max_bs": 64}},
            "internal_states": [{"effective_max_running_requests_per_dp": 60, "pp_max_micro_batch_size": 30}]}
    r = merge_resolved(info, startup)
    assert r["max_running_requests"] == 60  # the scheduler's enforced value wins
    assert r["pp_max_micro_batch_size"] == 30
    assert r["cuda_graph_max_bs_decode"] == 64
    assert r["version"] == "0.5.23" and r["tp_size"] == 2
    assert r["cuda_graph_bs_decode"][-1] == 64  # from the log: /server_info has no capture list
    # 0.5.9: internal_states is vars(server_args) after the scheduler's start-up (scheduler.py,
    # get_internal_state) and the resolved decode size is the top-level cuda_graph_max_bs
    old = merge_resolved({"cuda_graph_max_bs": 48, "pp_max_micro_batch_size": None,
                          "internal_states": [{"pp_max_micro_batch_size": 12}]}, {})
    assert old == {"cuda_graph_max_bs_decode": 48, "pp_max_micro_batch_size": 12}
    # a size the user set stays as set
    assert merge_resolved({"cuda_graph_max_bs_decode": 16, "cuda_graph_config": {"decode": {"max_bs": 16}}},
                          {})["cuda_graph_max_bs_decode"] == 16
    params = resolved_params(r)
    assert params["resolved.cuda_graph_bs_decode"] == "1,2,4,8,12,16,24,32,40,48,56,64"
    assert params["resolved.available_gpu_mem_gb_by_stage"] == "PP0=18.9;PP1=17.4"
    assert merge_resolved({}, {}) == {}


# ---- batch lines assembled the way each release assembles them (msg = ...; msg += ...), every piece
# rendered from that release's own format strings

def _piece(version: str, starts: str, values: dict[str, object], file: str) -> str:
    found = format_strings(version, starts, file, starts=True)
    assert found, f"SGLang {version} has no format string starting {starts!r} in {file}"
    return render(found[0], values)


POOLS = {  # decode-line usage of each KV pool kind: what the parser must make of it
    "plain": {"token": 5120, "token_usage": 0.31},
    "swa": {"full_token": 5120, "full_token_usage": 0.31, "swa_token": 2048, "swa_token_usage": 0.62,
            "token": 5120, "token_usage": 0.62},
    "mamba": {"full_token": 5120, "full_token_usage": 0.31, "mamba_num": 12, "mamba_usage": 0.75,
              "token": 5120, "token_usage": 0.31},
}


def _files(version: str) -> tuple[str, str]:
    """Where a release keeps its batch-line pieces and its KV-usage pieces: the scheduler's metrics
    mixin up to 0.5.12 (whose usage pieces moved to its runtime-checker mixin in 0.5.12), then
    metrics_reporter.py with pool_stats_observer.py from 0.5.13."""
    batch = next(f for f in ("metrics_reporter.py", "scheduler_metrics_mixin.py")
                 if format_strings(version, "Decode batch", f, starts=True))
    usage = next(f for f in ("pool_stats_observer.py", "scheduler_runtime_checker_mixin.py",
                             "scheduler_metrics_mixin.py")
                 if format_strings(version, "#token: {}", f, starts=True))
    return batch, usage


# the KV-usage fields of each pool kind, in the order every recorded release prints them, and a value
# for each placeholder any release uses in them
USAGE_FIELDS = {
    ("plain", False): ["#token: {}"], ("plain", True): ["token usage: {}"],
    ("swa", False): ["#full token: {}", "full token usage: {}", "#swa token: {}", "swa token usage: {}"],
    ("swa", True): ["full token usage: {}", "swa token usage: {}"],
    ("mamba", False): ["#full token: {}", "full token usage: {}", "mamba num: {}", "mamba usage: {}"],
    ("mamba", True): ["full token usage: {}", "mamba usage: {}"],
}
USAGE_VALUES: dict[str, object] = {
    **{k: 5120 for k in ("num_used", "full_num_used", "num_used_m", "self.full_num_used")},
    **{k: 0.31 for k in ("tok", "token_usage", "full_tok", "full_tok_m", "full_token_usage",
                         "self.full_token_usage")},
    **{k: 2048 for k in ("swa_num_used", "self.swa_num_used")},
    **{k: 0.62 for k in ("swa_token_usage", "self.swa_token_usage")},
    **{k: 12 for k in ("mamba_used", "mamba_num", "self.mamba_num_used")},
    **{k: 0.75 for k in ("mamba_usage", "self.mamba_usage")},
}


def _usage(version: str, pool: str, prefill: bool) -> str:
    """The KV-usage part of a batch line. 0.5.9 prints each pool kind from one format string ending in
    ", "; later releases keep one piece per field, which the caller joins with ", " and ends with ", "
    (scheduler_metrics_mixin.py in 0.5.10, the usage-parts methods of 0.5.12's runtime-checker mixin,
    pool_stats_observer.py from 0.5.13)."""
    _, f = _files(version)
    fields = USAGE_FIELDS[(pool, prefill)]
    whole = [x for x in format_strings(version, fields[0], f, starts=True)
             if all(field[:-4] in fixed_text(x) for field in fields)]
    if whole and fixed_text(whole[0]).endswith(", "):
        return render(whole[0], USAGE_VALUES)
    return ", ".join(_piece(version, field, USAGE_VALUES, f) for field in fields) + ", "


# the placeholders of the graph label and the queue length, as each family of releases spells them
GRAPH_AND_QUEUE = {"self._graph_backend_label": "cuda graph", "graph_backend[self.device]": "cuda graph",
                   "len(self.scheduler.waiting_queue)": 4, "len(self.waiting_queue)": 4}


def _decode_line(version: str, pool: str) -> str:
    f, _ = _files(version)
    head = _piece(version, "Decode batch", {"iter_msg": "", "num_running_reqs": 16,
                                            "token_usage_msg": _usage(version, pool, False)}, f)
    tail = _piece(version, "{}: {}, gen throughput", {**GRAPH_AND_QUEUE, "can_run_cuda_graph": True,
                                                       "self.last_gen_throughput": 901.77}, f)
    return head + tail


@pytest.mark.parametrize("version", RECORDED)
@pytest.mark.parametrize("pool", list(POOLS))
def test_decode_lines_rendered_from_each_release(version: str, pool: str) -> None:
    row = parse_log_line("[2026-12-01 10:00:01.250 PP1 TP0] " + _decode_line(version, pool))
    assert row is not None and row["kind"] == "decode" and (row["pp"], row["tp"]) == (1, 0)
    expected = {"running_req": 16, "cuda_graph": True, "gen_throughput": 901.77, "queue_req": 4,
                **POOLS[pool]}
    assert {k: row.get(k) for k in expected} == expected


@pytest.mark.parametrize("version", RECORDED)
def test_prefill_lines_rendered_from_each_release(version: str) -> None:
    f, _ = _files(version)
    stats = {"iter_msg": "", "prefill_stats.num_new_seqs": 2, "prefill_stats.log_input_tokens": 4096,
             "prefill_stats.log_hit_tokens": 1536, "token_usage_msg": _usage(version, "plain", True),
             "prefill_stats.num_running_reqs.total": 6, "prefill_stats.running_bs": 6,
             "len(self.scheduler.waiting_queue)": 3, "len(self.waiting_queue)": 3,
             "prefill_stats.num_pending_tokens": 0}
    line = _piece(version, "Prefill batch", stats, f)
    graph = {**GRAPH_AND_QUEUE, "can_run_cuda_graph": False}
    throughput = _piece(version, "input throughput", {"self.last_input_throughput": 12345.6}, f)
    # the graph label alone: "{label}: {bool}, " (before the throughput: 0.5.23) or "{label}: {bool}"
    # (last: 0.5.9)
    labels = {fixed_text(x): render(x, graph) for x in format_strings(version, "{}: {}", f, starts=True)
              if fixed_text(x) in ("{}: {}, ", "{}: {}")}
    assert len(labels) == 1, labels
    line += labels["{}: {}, "] + throughput if "{}: {}, " in labels else throughput + labels["{}: {}"]
    row = parse_log_line("[2026-12-01 10:00:02.500 PP0 TP0] " + line)
    assert row is not None and row["kind"] == "prefill"
    expected = {"new_seq": 2, "new_token": 4096, "cached_token": 1536, "token_usage": 0.31, "running_req": 6,
                "queue_req": 3, "cuda_graph": False, "input_throughput": 12345.6}
    assert {k: row.get(k) for k in expected} == expected


def test_a_musa_nodes_graph_label_reads_as_the_cuda_graph_column() -> None:
    # 0.5.23 labels the column by device: "cuda graph", "musa graph", "npu graph", "cpu graph"
    line = _decode_line("0.5.23", "plain").replace("cuda graph", "musa graph")
    assert parse_log_line("[2026-12-01 10:00:01.250 TP0] " + line)["cuda_graph"] is True


def test_the_documented_0_5_23_start_up_fixture_matches_the_releases_formats() -> None:
    # startup-0.5.23.log was written from the documented formats before the release records existed:
    # every line the parser draws a fact from must be one 0.5.23 can print
    read = 0
    for line in (DATA / "startup-0.5.23.log").read_text().splitlines():
        if line.startswith("#") or not resolved_from_startup_log(line):
            continue
        message = line[line.index("] ") + 2:]
        assert matches_a_format("0.5.23", message), message
        read += 1
    assert read >= 8
    old_wording = "KV Cache is allocated. #tokens: 5, K size: 1.00 GB, V size: 1.00 GB"  # 0.5.9's: no dtype
    assert not matches_a_format("0.5.23", old_wording) and matches_a_format("0.5.9", old_wording)
