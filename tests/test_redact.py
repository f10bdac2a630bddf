"""Secrets never reach MLflow: a sweep with an API key flag and a password in a URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.redact import redact_argv, redact_mapping, redact_override, redact_text, secret_values
from tests.conftest import run_cli


def test_redaction_rules() -> None:
    cfg = {"server": {"extra_args": {"api_key": "sk-live-123", "schedule_policy": "lpm"}},
           "tracking": {"uri": "http://alice:hunter22@mlflow.internal:5000"}}
    red = redact_mapping(cfg)
    assert red["server"]["extra_args"] == {"api_key": "***", "schedule_policy": "lpm"}
    assert red["tracking"]["uri"] == "http://alice:***@mlflow.internal:5000"
    assert redact_argv(["--api-key", "sk-live-123", "--hf-token=abc123", "--tp-size", "8"]) == [
        "--api-key", "***", "--hf-token=***", "--tp-size", "8"]
    assert redact_override("+server.extra_args.api_key=sk-live-123") == "+server.extra_args.api_key=***"
    assert redact_override("pp.size=8") == "pp.size=8"
    # words, not substrings: tokenizer and token counts are not secrets
    argv = ["--skip-tokenizer-init", "--pp-async-batch-depth", "0", "--max-total-tokens", "9000"]
    assert redact_argv(argv) == argv
    assert secret_values(cfg) == {"sk-live-123", "hunter22"}
    assert redact_text("server_args=ServerArgs(api_key='sk-live-123')", {"sk-live-123"}) == (
        "server_args=ServerArgs(api_key='***')")


@pytest.mark.slow
def test_secret_flag_is_refused_without_echoing_it(tmp_path: Path) -> None:
    secret = "sk-parasweep-secret-0042"
    # the simulator does not know --api-key: the preflight stops the run before anything launches
    result = run_cli(["model=tiny-test", "parallelism=pp2", "workload=tiny",
                      f"+server.extra_args.api_key={secret}"], tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--api-key" in result.stderr and secret not in result.stderr
    # refused before anything launched: no store was even created (what reaches a store is redacted
    # at the recorder, tested against a real sqlite store in test_trial_stages.py)
    assert not (tmp_path / "runs" / "mlflow.db").exists()
