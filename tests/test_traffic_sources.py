"""Real traffic read into requests: ShareGPT (the installed package's own file), the Mooncake and Azure
trace slices parasweep ships, arrival processes, and every bad input as one line naming its key.

Fast tier (but the per-class test, which predicts a point): no engine, no server. The ShareGPT file
is tokenized once per machine (a few seconds) and cached under $PARASWEEP_CACHE (default
~/.cache/parasweep)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import validate
from orchestrator.points.plan import load_points, request_spec
from tests.conftest import refusal
from vocab.hardware import load_hardware
from vocab.load import LoadPoint, RequestSpec, Source
from workloads.payloads import build_body
from workloads.sources import source_requests
from workloads.sources.sharegpt import packaged_path, read_conversations
from workloads.sources.tokenize import tokenizer
from workloads.sources.traces import read_trace, shipped_path

LLAMA_CONTEXT = 131072


def _cfg(source: str, *, model: str = "llama-3.1-8b", **workload: object) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.predict = True
    cfg.model.name, cfg.model.path = model, f"models/{model}"
    cfg.hardware = load_hardware("h100-sxm-x8")
    cfg.pp.size = 1
    cfg.workload.source = source
    cfg.workload.concurrency = [8]
    cfg.workload.ramp = 0
    for key, value in workload.items():
        setattr(cfg.workload, key, value)
    return cfg


# --- ShareGPT --------------------------------------------------------------------------------------------

def test_the_packaged_sharegpt_file_is_read_element_by_element_up_to_its_cut() -> None:
    convs, elements, cut = read_conversations(packaged_path())
    # the installed file ends inside its last element: json.loads fails, element by element does not
    assert cut and elements == 17_671
    assert all(len(c) % 2 == 0 and len(c) >= 2 for c in convs)  # question, answer, ...
    assert 0.7 < sum(len(c) >= 4 for c in convs) / len(convs) < 0.76  # about 73 % multi-turn


def test_a_users_sharegpt_file_cut_mid_element_keeps_the_complete_ones(tmp_path: Path) -> None:
    # the first three elements of the real file, the third cut in half
    text = packaged_path().read_text(encoding="utf-8")[:200_000]
    ends: list[int] = []
    while len(ends) < 3:
        ends.append(text.index("\n  },", ends[-1] + 1 if ends else 0))
    assert len(ends) == 3
    cut_file = tmp_path / "cut.json"
    cut_file.write_text(text[: (ends[1] + ends[2]) // 2], encoding="utf-8")
    convs, elements, cut = read_conversations(cut_file)
    assert cut and elements == 2 and len(convs) <= 2


def test_single_turn_requests_follow_the_peers_filter_and_the_context() -> None:
    wide = source_requests(RequestSpec(source=Source("sharegpt", context=LLAMA_CONTEXT), vocab_size=128256))
    narrow = source_requests(RequestSpec(source=Source("sharegpt", context=2048), vocab_size=128256))
    assert narrow.skipped["longer than the context"] > wide.skipped["longer than the context"]
    assert narrow.count + narrow.skipped["longer than the context"] == wide.count + \
        wide.skipped["longer than the context"]
    for i in range(0, 400, 7):
        req = narrow.request(i)
        assert len(req.ids) >= 4 and req.output_len >= 4 and len(req.ids) + req.output_len <= 2048
    assert "17,671 complete conversations read (the file is cut off after them)" in narrow.summary()


def test_turn_k_starts_token_for_token_with_turn_k_minus_1_and_its_recorded_answer() -> None:
    spec = RequestSpec(source=Source("sharegpt", multi_turn=True, context=LLAMA_CONTEXT), vocab_size=128256)
    reqs = source_requests(spec)
    enc = tokenizer("quicktok:llama3")
    starts = np.concatenate([[0], np.cumsum(reqs.session_turns)])
    checked = 0
    for s in range(40):
        for i in range(int(starts[s]), int(starts[s + 1]) - 1):
            prev, cur = reqs.request(i), reqs.request(i + 1)
            n = len(prev.ids)
            assert np.array_equal(cur.ids[:n], prev.ids)
            # then the recorded answer, exactly the tokens the previous turn asked the engine to generate
            answer_text = reqs.messages(i + 1)[len(reqs.messages(i))]["content"]
            answer_ids = enc.encode_batch([answer_text])[0]
            assert np.array_equal(cur.ids[n:n + prev.output_len], answer_ids)
            assert prev.output_len == len(answer_ids)
            checked += 1
    assert checked > 40


def test_ids_of_a_stand_in_tokenizer_fit_a_small_vocabulary() -> None:
    spec = RequestSpec(source=Source("sharegpt", tokenizer="quicktok:cl100k_base", context=4096),
                       vocab_size=1024)
    body, n_in, n_out = build_body(spec, 3)
    assert len(body["input_ids"]) == n_in and max(body["input_ids"]) < 1024
    assert body["sampling_params"]["max_new_tokens"] == n_out and body["sampling_params"]["ignore_eos"]


# --- traces ----------------------------------------------------------------------------------------------

def test_mooncake_blocks_with_the_same_hash_id_are_the_same_tokens() -> None:
    trace = read_trace("mooncake", None)
    assert len(trace) == 624 and trace.times_s[0] == 0 and np.all(np.diff(trace.times_s) >= 0)
    reqs = source_requests(RequestSpec(source=Source("mooncake", context=LLAMA_CONTEXT), vocab_size=128256))
    seen: dict[int, np.ndarray] = {}
    shared = 0
    for i in range(60):
        req = reqs.request(i)
        row = int(reqs.rows[i])  # type: ignore[attr-defined]
        assert len(req.ids) == trace.input_len[row] and req.output_len == trace.output_len[row]
        for b, h in enumerate(trace.hash_ids[row]):  # type: ignore[index]
            block = req.ids[b * 512:(b + 1) * 512]
            if h in seen and len(block) == 512 and len(seen[h]) == 512:
                assert np.array_equal(block, seen[h])
                shared += 1
            seen.setdefault(h, block)
    assert shared > 50  # the conversation trace shares its first block widely


def test_azure_trace_times_and_lengths() -> None:
    trace = read_trace("azure", None)
    assert len(trace) == 1000 and trace.hash_ids is None
    assert trace.times_s[0] == 0 and 200 < trace.times_s[-1] < 230
    assert np.median(trace.input_len) == 999  # the slice's README


def test_a_trace_point_replays_the_window_at_its_speed() -> None:
    cfg = _cfg("mooncake", arrival="trace", trace_speed=[1.0, 4.0], trace_start_s=30.0,
               trace_window_s=60.0, concurrency=[], warmup_requests=0)
    validate(cfg)
    times = source_requests(request_spec(cfg)).times_s
    points = [p for p in load_points(cfg) if p.open_loop]
    assert [p.arrival for p in points] == ["trace", "trace"]
    slow, fast = (p.send_offsets() for p in points)
    assert np.allclose(slow, times) and np.allclose(fast, times / 4)
    assert slow[-1] < 60 and len(slow) == len(times)
    assert points[1].rate == pytest.approx(4 * points[0].rate, rel=0.01)


# --- arrivals --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_arrivals_have_the_rate_and_the_coefficient_of_variation_asked_for(cv: float) -> None:
    gaps = np.diff(LoadPoint(rate=5.0, num_requests=40_000, arrival=f"gamma:{cv}").send_offsets())[1:]
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_sessions_become_closed_loop_points_of_whole_sessions() -> None:
    cfg = _cfg("sharegpt", multi_turn=True, concurrency=[4], requests_per_concurrency=5,
               warmup_requests=0, think_time_s=0.5)
    validate(cfg)
    (point,) = load_points(cfg)
    turns = source_requests(request_spec(cfg)).session_turns
    assert point.sessions == turns[: len(point.sessions)] and point.think_s == 0.5
    assert point.num_requests == sum(point.sessions) >= 20 > sum(point.sessions[:-1])
    # sessions arriving at a rate: the same whole sessions, their first turns on the arrival process
    cfg = _cfg("sharegpt", multi_turn=True, concurrency=[], rate=[2.0], arrival="gamma:1.5",
               requests_per_concurrency=10, warmup_requests=0)
    validate(cfg)
    (point,) = load_points(cfg)
    assert point.rate == 2.0 and point.sessions == turns[: len(point.sessions)]
    assert len(point.session_offsets()) == len(point.sessions) and point.session_offsets()[0] == 0


# --- bad input, one line each ----------------------------------------------------------------------------

def test_unknown_source_and_arrival() -> None:
    valid = "random, sharegpt, mooncake, azure, shared-prefix"
    assert f"workload.source=sharegtp: invalid; valid: {valid}" in refusal(_cfg("sharegtp"))
    msg = refusal(_cfg("random", arrival="bursty", rate=[2.0]))
    assert "workload.arrival=bursty" in msg and "gamma:CV" in msg
    assert "gamma:2" in refusal(_cfg("random", arrival="gamma:-1", rate=[2.0]))
    msg = refusal(_cfg("sharegpt", arrival="trace"))
    assert "workload.arrival=trace" in msg and "workload.source=mooncake or azure" in msg


def test_missing_or_unreadable_files(tmp_path: Path) -> None:
    for source in ("sharegpt", "mooncake", "azure"):
        msg = refusal(_cfg(source, dataset_path=str(tmp_path / "nope")))
        assert f"workload.dataset_path={tmp_path / 'nope'}" in msg and "No such file" in msg, msg


def test_a_malformed_trace_line_is_named_by_its_number(tmp_path: Path) -> None:
    lines = shipped_path("mooncake").read_text().splitlines()[:5]
    lines[3] = lines[3][:40]  # a line cut short
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert f"{bad}:4: not JSON" in refusal(_cfg("mooncake", dataset_path=str(bad)))
    rows = shipped_path("azure").read_text().splitlines()[:6]
    rows[4] = rows[4].replace(",", ";", 1)
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("\n".join(rows) + "\n")
    assert f"{bad_csv}:5: expected TIMESTAMP" in refusal(_cfg("azure", dataset_path=str(bad_csv)))
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("time,in,out\n1,2,3\n")
    assert "starts with the header TIMESTAMP,ContextTokens,GeneratedTokens" in refusal(
        _cfg("azure", dataset_path=str(wrong)))


def test_requests_longer_than_the_context_are_skipped_and_counted() -> None:
    # Llama 2's 4,096-token context: most of Mooncake's long prompts do not fit
    cfg = _cfg("mooncake", model="llama-2-7b")
    validate(cfg)
    reqs = source_requests(request_spec(cfg))
    assert reqs.skipped["longer than the context"] > 400 and reqs.count > 0
    assert "longer than the context" in reqs.summary()
    # the five requests at 30 s all need more than 4,096 tokens
    msg = refusal(_cfg("mooncake", model="llama-2-7b", trace_start_s=30.0, trace_window_s=1.0))
    assert "every request in the window is empty or longer than the model's context (4096)" in msg


def test_a_trace_needs_a_token_api_and_sessions_need_sharegpt() -> None:
    assert "workload.api=chat: invalid (a mooncake trace has token counts, not text)" in refusal(
        _cfg("mooncake", api="chat"))
    assert "workload.multi_turn=True" in refusal(_cfg("azure", multi_turn=True))
    assert "workload.trace_speed=[0]" in refusal(_cfg("azure", arrival="trace", concurrency=[],
                                                      trace_speed=[0]))
    assert "workload.tokenizer=quicktok:gpt2" in refusal(_cfg("sharegpt", tokenizer="quicktok:gpt2"))


# --- results per prompt-length class -------------------------------------------------------------------

@pytest.mark.slow  # predicts a point (a few seconds): the full suite
def test_ttft_per_prompt_length_class_where_lengths_vary(tmp_path: Path) -> None:
    from analysis.by_length import class_lines, class_rows
    from simulator.predict import predict_point
    from workloads.length_classes import length_class

    cfg = _cfg("sharegpt", concurrency=[16], requests_per_concurrency=3)
    validate(cfg)
    from orchestrator.engines.virtual import prediction_argv

    (point,) = load_points(cfg)
    argv = prediction_argv(cfg, tmp_path)
    result = predict_point(argv, point, request_spec(cfg))
    m = result.metrics
    classes = sorted({length_class(r.input_tokens) for r in result.records})
    assert len(classes) >= 2  # ShareGPT's prompts span several classes
    counted = sum(int(m[k]) for k in m if k.startswith("requests_in_"))
    assert 0 < counted <= len(result.records)
    for cls in (c for c in classes if f"requests_in_{c}" in m):
        assert m[f"ttft_p50_ms_in_{cls}"] <= m[f"ttft_p99_ms_in_{cls}"]
    lines = class_lines(class_rows([("#0", {f"c16/{k}": v for k, v in m.items()})]), 100)
    assert lines[0].startswith("TTFT p99 by prompt length") and lines[1].startswith("  c16 #0  0-256: ")
    assert all(len(line) <= 100 for line in lines)
    # fixed lengths: nothing new
    fixed = predict_point(argv, point, RequestSpec(input_len=64, output_len=8))
    # every class's names are names MLflow accepts (alphanumerics, _ - . space : /)
    from workloads.length_classes import CLASSES

    assert all(re.fullmatch(r"[\w\-. :/]+", f"c8/ttft_p99_ms_in_{c}") for c in CLASSES)
    per_class = ("requests_in_", "ttft_p50_ms_in_", "ttft_p99_ms_in_")
    assert not [k for k in fixed.metrics if k.startswith(per_class)]
