"""Published forward-only runs (SGLang's bench_one_batch) replayed on the step costs: the file read (and a
bad line refused by line and field), each run replayed as that script times a step, and the
behaviour the replay must show whatever the constants: more batch or context costs more, TP8 beats
TP1 at batch 1, an eager forward is slower than its CUDA graph, and what cannot be modelled is skipped
with its reason. No engine process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.fidelity.corpus import CorpusError
from orchestrator.fidelity.forward import (
    LLAMA3_8B,
    ForwardEntry,
    main,
    read_forward,
    replay_forward,
    step_parts,
    tp_step_ratio,
)
from simulator.costs import decode_shape
from simulator.predict import load_config
from tests.conftest import ROOT

FILE = ROOT / "data" / "published" / "forward.jsonl"
# Llama-3-8B's BF16 weights read once per step at the H100's 3.35 TB/s: no batch-1 step is faster
WEIGHT_READ_FLOOR_MS = 16.06e9 / 3.35e12 * 1e3


def _llama(tp: int, batch: int, graph: str = "on") -> ForwardEntry:
    """The published Llama-3-8B run of this layout (flashinfer where there are several)."""
    found = [e for e in read_forward(FILE)
             if e.model == LLAMA3_8B and e.tp == tp and e.batch_size == batch and e.cuda_graph == graph
             and "flashinfer" in (e.attention_backend or "")]
    assert found, (tp, batch, graph)
    return found[0]


def _step(entry: ForwardEntry, **changes: object) -> float:
    result = replay_forward(entry.model_copy(update=changes))
    assert not result.skipped, result.skipped
    assert result.predicted_step_ms is not None
    return result.predicted_step_ms


def test_the_shipped_file_reads_with_a_source_for_every_run() -> None:
    entries = read_forward(FILE)
    assert len(entries) == 37
    assert all(e.source.startswith("https://") for e in entries)
    assert len({e.id for e in entries}) == len(entries)


def test_a_malformed_line_is_refused_in_one_line_naming_the_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = FILE.read_text().splitlines()[0]
    f = tmp_path / "mine.jsonl"
    f.write_text(good + "\n\n" + json.dumps(json.loads(good) | {"id": "mine", "batch_size": "many"}) + "\n")
    with pytest.raises(CorpusError, match=r"mine.jsonl line 3 \(mine\): batch_size: Input should be a "
                                          r"valid integer"):
        read_forward(f)
    f.write_text(good + "\n{not json\n")
    with pytest.raises(CorpusError, match="line 2: not JSON"):
        read_forward(f)
    f.write_text('{"id": "x"}\n')
    assert main([str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 1 (x)" in err


def test_llama3_8b_tp1_batch1_is_near_its_published_step() -> None:
    entry = _llama(1, 1)
    result = replay_forward(entry)
    assert result.graph and result.measured_step_ms == pytest.approx(7.37)
    assert result.predicted_step_ms is not None
    assert WEIGHT_READ_FLOOR_MS < result.predicted_step_ms < 10.0
    assert result.step_error is not None and abs(result.step_error) < 0.25
    assert any("Llama-3.1-8B's shapes" in n for n in result.notes)
    assert any("h100-sxm-x8" in n for n in result.notes)


def test_the_step_grows_with_batch_and_with_context() -> None:
    entry = _llama(1, 1)
    by_batch = [_step(entry, batch_size=b) for b in (1, 8, 64, 128)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    # longer prompts, or a longer output (the median step sits at input + output / 2)
    by_context = [_step(entry, input_len=n) for n in (128, 2048, 8192)]
    assert by_context[0] < by_context[1] < by_context[2]
    assert _step(entry, output_len=4096) > _step(entry, output_len=8)
    # the published pair agrees: batch 128 is slower than batch 1 (measured and predicted)
    big = replay_forward(_llama(1, 128))
    small = replay_forward(entry)
    assert big.measured_step_ms > small.measured_step_ms  # type: ignore[operator]
    assert big.predicted_step_ms > small.predicted_step_ms  # type: ignore[operator]


def test_tp8_is_faster_than_tp1_at_batch_1() -> None:
    tp1, tp8 = replay_forward(_llama(1, 1)), replay_forward(_llama(8, 1))
    assert tp8.predicted_step_ms < tp1.predicted_step_ms  # type: ignore[operator]
    assert tp8.step_parts_ms["comm"] > 0 == tp1.step_parts_ms["comm"]
    ratio = tp_step_ratio([tp1, tp8])
    assert ratio is not None and ratio[0] == pytest.approx(3.35 / 7.37) and 0 < ratio[1] < 1


def test_an_eager_run_is_slower_than_its_cuda_graph_twin() -> None:
    graph, eager = replay_forward(_llama(1, 1)), replay_forward(_llama(1, 1, graph="off"))
    assert graph.graph and not eager.graph
    assert eager.predicted_step_ms > graph.predicted_step_ms  # type: ignore[operator]
    assert eager.measured_step_ms > graph.measured_step_ms  # type: ignore[operator]
    # the eager forward's host dispatch is what shows, and the sampler's dispatch after it
    assert eager.step_parts_ms["dispatch"] > graph.step_parts_ms["dispatch"]
    assert eager.step_parts_ms["sampling"] > 0 == graph.step_parts_ms["sampling"]
    # above the largest captured batch (160 on the releases of 2024) the forward runs eagerly too
    assert not replay_forward(_llama(1, 1).model_copy(update={"batch_size": 161})).graph
    assert replay_forward(_llama(1, 1).model_copy(update={"batch_size": 160})).graph


def test_the_host_parts_bench_one_batch_pays_are_charged_in_full() -> None:
    cfg = load_config(["--model-path", "models/llama-3.1-8b", "--sim-hardware", "h100-sxm-x8",
                       "--tp-size", "1"])
    shape = decode_shape([200] * 4)
    parts = step_parts(cfg.cost, shape)
    h = cfg.cost.host_costs()
    assert parts["prepare_batch"] == h.schedule(4) and parts["forward_batch_init"] == h.prepare(4)
    forward = cfg.cost.breakdown(0, shape)
    # nothing hides the preparation: the step is the forward plus both parts (the sampler hides behind
    # a graph replay), and no poll, result processing or streaming
    assert parts["total"] == pytest.approx(forward["total"] + h.schedule(4) + h.prepare(4))


def test_what_cannot_be_modelled_is_skipped_with_its_reason() -> None:
    results = {e.id: replay_forward(e) for e in read_forward(FILE)}
    skipped = {i: r for i, r in results.items() if r.skipped}
    assert all(r.predicted_step_ms is None and r.predicted_prefill_ms is None for r in skipped.values())
    reasons = " | ".join(r.skipped for r in skipped.values())
    for why in ("not SGLang's bench_one_batch", "ROCm", "torch.compile", "live server",
                "not in parasweep's catalogue"):
        assert why in reasons
    assert all("\n" not in r.skipped for r in skipped.values())
    assert all(r.skipped for i, r in results.items() if i.startswith("vllm-"))
    # a prefill-only run is replayed for its prefill
    prefill_only = [r for r in results.values() if not r.skipped and r.measured_step_ms is None]
    assert prefill_only and all(r.prefill_error is not None for r in prefill_only)


def test_the_command_prints_predictions_and_the_summary(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "forward.json"
    assert main([str(FILE), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted" in text.splitlines()[0]
    assert "median |error|" in text and "TP8 / TP1: measured 0.46, predicted" in text
    data = json.loads(out.read_text())
    assert len(data["results"]) == 37 and data["median_abs_step_error"] > 0
