"""The mechanisms of SGLang's PP event loop that ``simulator/pp_loop.py`` models, one test each, in
virtual time (docs/simulator.md, "What each stage's host does" has the release's lines for each).

Each test changes one host cost or one setting and checks that the time between a request's tokens moves
by what that mechanism says, and only where it says."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simulator.costs import decode_shape
from simulator.predict import VirtualTrial, load_config
from vocab.load import LoadPoint, RequestSpec

REPO = Path(__file__).resolve().parent.parent
KIMI_PP8 = ["--model-path", str(REPO / "models" / "kimi-k2"), "--pp-size", "8",
            "--sim-hardware", "rtx-pro-6000-pcie-x8", "--sim-step-costs", "roofline"]
MB1 = [*KIMI_PP8, "--pp-max-micro-batch-size", "1"]
DECODE = RequestSpec(api="generate", input_len=32, output_len=256)


def tpot_ms(argv: list[str], concurrency: int, spacing_s: float = 0.0, **costs: float) -> float:
    """Median time between tokens of a closed loop of ``concurrency`` requests, with some of the loop's
    host costs (``CostParams`` fields, microseconds) changed."""
    cfg = load_config(argv)
    cfg.cost.p = replace(cfg.cost.p, **costs)
    trial = VirtualTrial(cfg)
    trial.send_spacing = spacing_s
    point = LoadPoint(num_requests=concurrency, concurrency=concurrency)
    return trial.run_point(point, DECODE).metrics["tpot_p50_ms"]


def test_every_stage_processes_every_result_but_only_stage_0_streams() -> None:
    """Eight micro-batches of one request: the last stage paces the ring and, at depth 0, processes a
    result between every two of its forwards. A millisecond more of ``process_batch_result`` (run by every
    stage) costs that stage a millisecond per micro-batch: 8 ms a token. A millisecond more of
    ``stream_output`` (stage 0 alone sends to the detokenizer) lands on stage 0, which has time to spare:
    almost nothing."""
    base = tpot_ms(MB1, 8)
    slower_process = tpot_ms(MB1, 8, process_base_us=1170.0)
    slower_stream = tpot_ms(MB1, 8, stream_base_us=1050.0)
    assert slower_process - base == pytest.approx(8.0, rel=0.05)
    assert slower_stream - base < 0.5


def test_a_single_request_pays_the_host_work_of_stage_0_once_a_token() -> None:
    """One request: its ids reach stage 0 (a gloo message and an NCCL send), stage 0 processes and
    streams them, polls, builds and prepares the next step. Each of those is on the path once per token;
    the other stages' host work is hidden behind the forward the stage before is still running."""
    cfg = load_config(KIMI_PP8)
    base = tpot_ms(KIMI_PP8, 1)
    assert base / 1e3 == pytest.approx(cfg.cost.ring_trip(decode_shape([160])), rel=0.01)
    for name in ("process_base_us", "stream_base_us", "sched_base_us", "prepare_base_us"):
        slower = tpot_ms(KIMI_PP8, 1, **{name: getattr(cfg.cost.p, name) + 500.0})
        assert slower - base == pytest.approx(0.5, abs=0.02), name


def test_depth_frees_the_last_stage_from_waiting_on_its_own_forward() -> None:
    """At depth 0 the last stage sends the ids of the forward it has just launched, queued behind that
    forward on its schedule stream, and ``.tolist()`` in its result processing waits for the stream: its
    host idles through every forward. At depth 1 it sends ids a pass old, so a slower host costs its GPU
    nothing until the host work outlasts the forward."""
    extra = 1000.0
    d0 = tpot_ms(MB1, 8), tpot_ms(MB1, 8, prepare_base_us=250.0 + extra)
    d1 = (tpot_ms([*MB1, "--pp-async-batch-depth", "1"], 9),
          tpot_ms([*MB1, "--pp-async-batch-depth", "1"], 9, prepare_base_us=250.0 + extra))
    assert d0[1] - d0[0] == pytest.approx(8 * extra / 1e3, rel=0.05)
    assert d1[1] - d1[0] < 0.1 * (d0[1] - d0[0])


def test_a_stage_runs_at_most_a_pass_or_two_ahead_of_the_next() -> None:
    """A gloo send completes only once the receiver has posted its receive, and each stage waits for
    its previous relay, output and hidden-state sends before the next ones: so however slow the stage
    after it, no stage gets more than a couple of passes ahead."""
    cfg = load_config(MB1)
    cfg.cost.p = replace(cfg.cost.p, process_base_us=3000.0)  # a host-bound ring
    trial = VirtualTrial(cfg)
    replica = trial.replicas[0]
    loop = replica.pipeline
    assert loop is not None
    leads: list[int] = []
    replica.output_hook = lambda: leads.extend(a - b for a, b in zip(loop.passes, loop.passes[1:],
                                                                        strict=False))
    trial.run_point(LoadPoint(num_requests=8, concurrency=8), DECODE)
    assert leads and max(leads) <= 2


def test_at_depth_above_0_a_micro_batch_waits_for_the_next_slots_outputs() -> None:
    """At depth > 0 the exchange comes before the forward: each stage queues the receive of the next
    slot's outputs on the stream its forward then waits for, and the stage before passes those outputs
    on only behind the hidden states it is itself waiting for. A lone request followed by a batch of
    seven (a burst's first request rides alone) therefore goes round at the pace of the batch behind it:
    the lone request's tokens come slower at depth 1 than at depth 0, though depth adds slots."""
    spaced = 20e-6
    d0 = tpot_ms(KIMI_PP8, 8, spacing_s=spaced)
    d1 = tpot_ms([*KIMI_PP8, "--pp-async-batch-depth", "1"], 8, spacing_s=spaced)
    assert d1 > 1.02 * d0
