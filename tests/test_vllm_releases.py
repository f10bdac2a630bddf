"""What each recorded vLLM release offers (``orchestrator/engines/vllm_compat/releases/vllm-<version>.json``,
read from its wheel by ``scripts/vllm_facts.py`` without importing it), checked against the parser the
release builds itself where one was built (``tests/data/vllm/flags-<version>-imported.json``, written by
``scripts/vllm_imported_flags.py`` inside a virtual environment with that vLLM installed)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from orchestrator.engines.vllm_compat.versions import RECORDED

IMPORTED = Path(__file__).parent / "data" / "vllm"
# an option `vllm serve` adds in its own subcommand, beside the parser make_arg_parser builds
SERVE_ONLY = {"--grpc"}
# options whose choices the release computes when the parser is built (a comprehension, not a literal
# or a Literal type): the static reading lists none, so the check against them is looser, never stricter
COMPUTED_CHOICES = {"--collect-detailed-traces"}


def _record(version: str) -> dict:
    folder = resources.files("orchestrator.engines.vllm_compat.releases")
    return json.loads((folder / f"vllm-{version}.json").read_text())


@pytest.mark.parametrize("path", sorted(IMPORTED.glob("flags-*-imported.json")), ids=lambda p: p.name)
def test_the_static_reading_matches_the_parser_the_release_builds(path: Path) -> None:
    imported = json.loads(path.read_text())
    version = imported["vllm_version"]
    static = _record(version)["flags"]
    parser = imported["flags"]
    assert set(parser) == set(static) - SERVE_ONLY
    for option, real in parser.items():
        read = static[option]
        assert (read["dest"], read["value"]) == (real["dest"], real["value"]), option
        if option not in COMPUTED_CHOICES:
            assert read.get("choices", []) == real["choices"], option


def test_every_record_names_its_wheel_and_the_recorded_set_is_complete() -> None:
    folder = resources.files("orchestrator.engines.vllm_compat.releases")
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    assert files == sorted(f"vllm-{v}.json" for v in RECORDED)
    for version in RECORDED:
        data = json.loads((folder / f"vllm-{version}.json").read_text())
        assert data["wheel"].startswith(f"vllm-{version}-") and len(data["wheel_sha256"]) == 64
        # what a trial reads from a vLLM server, in every recorded release
        routes = {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions"}
        assert routes <= set(data["routes"])
        assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:time_to_first_token_seconds"} <= set(data["metrics"])


def test_the_stats_line_a_trial_would_read_is_in_every_release() -> None:
    # the periodic stats line's parts; the KV part names its device from 0.34 on ("%s KV cache usage")
    for version in RECORDED:
        formats = _record(version)["log_formats"]
        parts = ("Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s",
                 "Running: %d reqs", "Waiting: %d reqs", "Preemptions: %d", "Prefix cache hit rate: %.1f%%")
        for part in parts:
            assert part in formats, (version, part)
        assert "GPU KV cache usage: %.1f%%" in formats or "%s KV cache usage: %.1f%%" in formats, version
    assert "%s KV cache usage: %.1f%%" in _record("0.34.0")["log_formats"]
    assert "GPU KV cache usage: %.1f%%" in _record("0.19.0")["log_formats"]


def test_every_release_records_its_speculative_methods_counters_and_line() -> None:
    # what a speculative trial builds and reads: the methods parasweep maps, the four counters, the line
    for version in RECORDED:
        data = _record(version)
        assert {"eagle", "eagle3", "mtp", "ngram", "draft_model"} <= set(data["speculative_methods"]), version
        assert {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens",
                "vllm:spec_decode_num_accepted_tokens_per_pos"} <= set(data["metrics"]), version
        assert any(f.startswith("SpecDecoding metrics: Mean acceptance length: %.2f") for f in
                   data["log_formats"]), version
    assert "medusa" in _record("0.19.0")["speculative_methods"]
    assert "medusa" not in _record("0.34.0")["speculative_methods"]  # removed in 0.34
