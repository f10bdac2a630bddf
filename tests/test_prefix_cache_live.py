"""The prefix cache of the simulated engine over real HTTP: what each response reports, what the log
lines and ``/metrics`` say, ``/flush_cache``, and the prediction of the same requests.

One request at a time, so which prompts are cached when each arrives does not depend on timing: every
number here is exact."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from servers import simulator_process

from simulator.predict import predict_point
from vocab.assets import model_dir
from vocab.hardware import resolve_hardware_path
from vocab.load import LoadPoint, RequestSpec, SharedPrefix, Source
from workloads import run_point

pytestmark = pytest.mark.slow

SHAPE = SharedPrefix(groups=2, prompts_per_group=8, system_len=200, question_len=20, output_len=8)
SPEC = RequestSpec(api="generate", vocab_size=1024, source=Source("shared-prefix", shared_prefix=SHAPE))
POINT = LoadPoint(concurrency=1, num_requests=16, ramp_s=0.0)
CACHED_LINE = re.compile(r"Prefill batch, #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+),")


def _post(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_engine_reports_the_prefixes_it_reused_and_forgets_them_when_flushed(tmp_path: Path) -> None:
    with simulator_process(["--enable-metrics"], tmp_path) as server:
        server.wait_ready(60)
        result = run_point(server.url, POINT, SPEC)
        m = result.metrics
        # each group's first request computes its system prompt; the other 7 of each reuse its 200 tokens
        assert m["prefill_cached_tokens"] == 2 * 7 * 200
        assert m["prefill_computed_tokens"] == 16 * 220 - 2 * 7 * 200
        assert m["cache_hit_rate"] == pytest.approx(m["offered_hit_rate"]) == pytest.approx(2800 / 3520)
        # the scheduler's log lines say the same, batch by batch (the health probe's one token aside)
        lines = [CACHED_LINE.search(x) for x in (tmp_path / "server.log").read_text().splitlines()]
        cached = [int(x.group(2)) for x in lines if x is not None]
        assert sum(cached) == 2800 and cached.count(200) == 14
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert re.search(r'sglang:realtime_tokens_total\{[^}]*mode="prefill_cache"[^}]*\} 2800\.0', text)
        assert re.search(r"sglang:cache_hit_rate\{[^}]*\} 0\.9", text)  # the last batch: 200 of 220
        # idle: the cache is emptied, and the same requests are computed whole again
        assert _post(server.url + "/flush_cache")[0] == 200
        again = run_point(server.url, LoadPoint(concurrency=1, num_requests=1), SPEC)
        assert again.records[0].cached_tokens == 0
    # the prediction of the same requests reuses exactly as much
    argv = ["--model-path", str(model_dir("models/tiny-test")), "--sim-hardware",
            str(resolve_hardware_path("h100-sxm-x8"))]
    predicted = predict_point(argv, POINT, SPEC).metrics
    assert predicted["prefill_cached_tokens"] == m["prefill_cached_tokens"]
    assert predicted["cache_hit_rate"] == m["cache_hit_rate"]


def test_disabled_the_engine_reuses_nothing(tmp_path: Path) -> None:
    with simulator_process(["--disable-radix-cache"], tmp_path) as server:
        server.wait_ready(60)
        m = run_point(server.url, POINT, SPEC).metrics
    assert m["prefill_cached_tokens"] == 0 and m["cache_hit_rate"] == 0.0
    assert m["offered_hit_rate"] == pytest.approx(2800 / 3520)  # what it was offered, all the same


@pytest.mark.parametrize("router", ["round_robin", "cache_aware"])
def test_two_replicas_measured_against_their_prediction(tmp_path: Path, router: str) -> None:
    # one request at a time: round-robin alternates the replicas, so each computes every group's
    # system prompt for itself; cache-aware sends a prompt where its beginning is cached
    flags = ["--dp-size", "2", "--sim-router", router]
    with simulator_process(flags, tmp_path) as server:
        server.wait_ready(60)
        measured = run_point(server.url, POINT, SPEC).metrics
    argv = ["--model-path", str(model_dir("models/tiny-test")), "--sim-hardware",
            str(resolve_hardware_path("h100-sxm-x8")), *flags]
    predicted = predict_point(argv, POINT, SPEC).metrics
    assert measured["prefill_cached_tokens"] == predicted["prefill_cached_tokens"]
    if router == "round_robin":  # 2 groups x 2 replicas: the system prompt computed 4 times
        assert measured["prefill_cached_tokens"] == (16 - 4) * 200
    else:  # once per group, as with one replica
        assert measured["prefill_cached_tokens"] == (16 - 2) * 200
