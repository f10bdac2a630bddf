"""``python -m orchestrator fidelity``: the published corpus read (and a bad file refused by line), an
entry replayed on the simulated engine in virtual time as bench_serving sent it, and the comparison."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.cli import main
from orchestrator.fidelity.compare import compared_metrics, saturated
from orchestrator.fidelity.corpus import CorpusError, read_corpus
from orchestrator.fidelity.replay import plan, predict
from simulator.predict import load_config, resolved_server_info
from simulator.replay import replay
from tests.conftest import ROOT

CORPUS = ROOT / "data" / "published" / "sglang.jsonl"


def _entry(ident: str):  # type: ignore[no-untyped-def]
    return next(e for e in read_corpus(CORPUS) if e.id == ident)


def test_the_shipped_corpus_reads_with_a_source_for_every_entry() -> None:
    entries = read_corpus(CORPUS)
    assert len(entries) >= 40
    assert all(e.source_url.startswith("https://") for e in entries)


def test_the_set_kept_aside_reads_and_shares_no_run_with_the_corpus() -> None:
    aside = read_corpus(ROOT / "data" / "published" / "aside" / "served.jsonl")
    corpus = read_corpus(CORPUS)
    assert len(aside) >= 15 and all(e.source_url.startswith("https://") for e in aside)
    assert not {e.id for e in aside} & {e.id for e in corpus}
    # and no page of the corpus: the set judges the model on sources it has not seen either
    assert not {e.source_url for e in aside} & {e.source_url for e in corpus}


def test_a_bad_line_is_refused_with_its_line_number(tmp_path: Path) -> None:
    good = CORPUS.read_text().splitlines()[0]
    bad = json.loads(good) | {"id": "mine", "gpu_count": "eight"}
    f = tmp_path / "mine.jsonl"
    f.write_text(good + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(CorpusError, match=r"line 3 \(mine\): gpu_count: Input should be a valid integer"):
        read_corpus(f)
    f.write_text(good + "\n{not json\n")
    with pytest.raises(CorpusError, match="line 2: not JSON"):
        read_corpus(f)


def test_the_command_refuses_a_bad_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "x"}\n')
    assert main(["--published", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 1 (x)" in err


def test_a_rate_of_inf_sends_every_request_at_t0(tmp_path: Path) -> None:
    entry = _entry("moe-cookbook-dsr1-b200-tp8-random1k1k-c1")  # rate inf, max concurrency 1
    p = plan(entry, tmp_path)
    assert all(r.offset_s == 0.0 for r in p.requests)
    records = replay(load_config(p.argv), p.requests, max_concurrency=None)
    assert {r.send_time for r in records} == {0.0}
    # with the published cap of 1 they go one after another, each sent when the previous one ended
    capped = replay(load_config(p.argv), p.requests, max_concurrency=1)
    for before, after in itertools.pairwise(capped):
        assert after.send_time == pytest.approx(before.end_time)


def test_an_entry_is_predicted_with_the_tools_numbers_and_the_headline_its_load_decides() -> None:
    entry = _entry("dense-dc-llama33-70b-tp4-h200-online-random-1024-rps1")
    _, predicted = predict(entry)
    assert predicted["total_input_tokens"] == entry.numbers()["total_input_tokens"]
    # below saturation the throughput repeats the offered rate: the headline is a latency
    assert not saturated(entry)
    names, headline = compared_metrics(entry)
    assert headline == "median_e2e_ms" and "output_throughput" in names
    assert predicted["output_throughput"] == pytest.approx(entry.numbers()["output_throughput"], rel=0.05)
    offline = _entry("dense-dc-llama33-70b-tp4-h200-offline-random-1024-1024-n3000")
    assert saturated(offline) and compared_metrics(offline)[1] == "output_throughput"


def test_a_ratio_to_another_run_replays_both_and_compares_the_ratio(tmp_path: Path) -> None:
    entry = _entry("pp-blog-dsv31-pp4tp8-fixed4k-prefill-thpt")  # "3.20x the TP8 baseline's throughput"
    reference = entry.reference()
    assert (reference.parallelism.tp, reference.parallelism.pp, reference.gpu) == (8, 1, "NVIDIA H20 141GB")
    assert reference.nodes == 1 and "chunked_prefill_size" not in reference.server_args  # null: its default
    assert reference.server_args["max_running_requests"] == 128  # the rest as the entry has it
    assert compared_metrics(entry) == (["input_throughput_relative"], "input_throughput_relative")
    # the source's 16 requests of 128K, sent at once (not stated: said in the entry)
    requests = plan(entry, tmp_path).requests
    assert [(r.input_len, r.output_len, r.offset_s) for r in requests] == [(131072, 1, 0.0)] * 16
    out = tmp_path / "out.json"
    assert main(["--only", entry.id, "--json", str(out), "--workers", "1"]) == 0
    (row,) = json.loads(out.read_text())["compared"]
    _, mine = predict(entry)
    _, theirs = predict(reference)
    assert row["predicted"] == pytest.approx(mine["input_throughput"] / theirs["input_throughput"])
    assert row["predicted"] > 1.5  # four pipeline stages of eight GPUs against one group of eight


def test_what_cannot_be_modelled_is_skipped_with_its_reason() -> None:
    with pytest.raises(NotModelled, match="gpt-oss"):
        predict(_entry("moe-cookbook-gptoss120b-b200-tp8-sharegpt-c100"))


def test_an_attention_dp_run_is_replayed_as_its_release_launched_it(tmp_path: Path) -> None:
    """A run published with ``--dp N --enable-dp-attention`` takes N ranks inside its TP group, not N
    replicas of it; on 0.4.1 that also turned the overlap scheduler off and halved the chunk."""
    plan_ = plan(_entry("moe-pr2643-dsv3-h200-tp8dpa-sharegpt5000"), tmp_path)
    argv = plan_.argv
    assert argv[argv.index("--dp-size") + 1] == "8" and "--enable-dp-attention" in argv
    assert "--disable-overlap-schedule" in argv
    assert argv[argv.index("--chunked-prefill-size") + 1] == str(4096 * 8)
    assert plan_.layout == "attention DP"
    info = resolved_server_info(argv)
    assert (info["attn_dp_size"], info["dp_size"], info["chunked_prefill_size"]) == (8, 1, 4096)
    assert len(info["internal_states"]) == 8


def test_the_json_lists_every_entry_compared_or_skipped(tmp_path: Path) -> None:
    keep = ("dense-dc-llama33-70b-tp4-h200-online-random-1024-rps1",
            "moe-cookbook-gptoss120b-b200-tp8-sharegpt-c100")
    lines = [line for line in CORPUS.read_text().splitlines() if json.loads(line)["id"] in keep]
    f = tmp_path / "two.jsonl"
    f.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.json"
    assert main(["--published", str(f), "--json", str(out), "--workers", "1"]) == 0
    data = json.loads(out.read_text())
    assert {r["id"] for r in data["compared"]} == {keep[0]}
    assert [s["id"] for s in data["skipped"]] == [keep[1]]
    row = data["compared"][0]
    assert set(row) >= {"id", "metric", "measured", "predicted", "headline"}
    assert sum(r["headline"] for r in data["compared"]) == 1
    assert all(math.isfinite(r["predicted"]) for r in data["compared"])


def test_a_users_own_measurement_names_its_model_and_profile(tmp_path: Path) -> None:
    """A model and GPU parasweep has no mapping for: skipped with the reason, or replayed where the entry
    names parasweep's folder and profile."""
    line = json.loads(next(line for line in CORPUS.read_text().splitlines()
                           if json.loads(line)["id"] == "dense-pr1060-llama8b-h100-random8192x8-prefill"))
    mine = line | {"id": "mine", "model": "acme/house-model-8b", "gpu": "Acme Accelerator X"}
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps(mine) + "\n")
    entry = read_corpus(f)[0]
    with pytest.raises(NotModelled, match="acme/house-model-8b: not in parasweep's catalogue"):
        predict(entry)
    named = mine | {"parasweep": {"model": "llama-3.1-8b", "hardware": "h100-sxm-x8"}}
    f.write_text(json.dumps(named) + "\n")
    plan_, predicted = predict(read_corpus(f)[0])
    assert plan_.family == "dense" and plan_.hardware == "h100-sxm-x8"
    assert predicted["total_input_tokens"] == line["measured"]["total_input_tokens"]
