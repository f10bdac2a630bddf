"""Live and predicted results of the same configuration agree within 5 % (issue 3).

The live side is the real thing: ``python -m simulator`` as its own process, real HTTP, driven by
``workloads.run_point``. The predicted side is ``simulator.predict.predict_point`` with the same argv and
load point. The live server runs at ``--sim-time-scale 4`` (4 simulated seconds per wall second) to keep
the test short; wall-clock metrics are converted back to simulated seconds before comparing.

Robustness on a loaded machine: the model's token times do not depend on wakeup jitter (the live driver
processes each event at its own simulated time), TPOT averages over 127 gaps, and throughput over the
whole point, so only arrival times (HTTP, client CPU) differ between the two runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simulator.predict import predict_point, resolved_server_info  # noqa: E402
from tests.test_simulator_server import Server  # noqa: E402
from workloads import LoadPoint, RequestSpec, run_point  # noqa: E402

SCALE = 4.0
# Kimi K2 PP8 on the PCIe box, one request per micro-batch: 8 micro-batches fill the ring, so the
# composition of each micro-batch does not depend on how the client's requests interleave in time.
ARGV = [
    "--model-path",
    str(REPO / "models" / "kimi-k2"),
    "--pp-size",
    "8",
    "--pp-max-micro-batch-size",
    "1",
    "--sim-hardware",
    "rtx-pro-6000-pcie-x8",
    "--random-seed",
    "1",
]
POINT = LoadPoint(num_requests=16, concurrency=8)
SPEC = RequestSpec(api="generate", input_len=32, output_len=128)


def test_live_server_and_prediction_agree_within_5_percent(tmp_path: Path) -> None:
    pred = predict_point(ARGV, POINT, SPEC)
    server = Server([*ARGV, "--sim-time-scale", f"{SCALE:g}", "--enable-metrics"], tmp_path)
    try:
        live = run_point(server.url, POINT, SPEC)
        info = server.get("/server_info")[1]
    finally:
        server.stop()
    assert live.valid and pred.valid, (live.invalid_reasons, pred.invalid_reasons)
    lm, pm = live.metrics, pred.metrics
    live_tok_s = lm["output_tok_s"] / SCALE  # wall seconds are 1/SCALE simulated seconds
    live_tpot = lm["tpot_p50_ms"] * SCALE
    assert live_tok_s == pytest.approx(pm["output_tok_s"], rel=0.05), (live_tok_s, pm["output_tok_s"])
    assert live_tpot == pytest.approx(pm["tpot_p50_ms"], rel=0.05), (live_tpot, pm["tpot_p50_ms"])
    # the same resolved configuration on both sides
    import json

    served = json.loads(info)
    predicted = resolved_server_info(ARGV)
    for key in (
        "max_running_requests",
        "pp_max_micro_batch_size",
        "max_total_num_tokens",
        "sim_stage_layers",
    ):
        assert served[key] == predicted[key]
