"""The end of a sweep as a new user reads it: the engine and why, one table within 100 columns with
the best of each column marked, the findings merged across trials with their predicted effect, then
where things are; and ``python run.py --help``.

The fast tests execute real trials in virtual time without Hydra (as tests/test_trial_stages.py does)
into a temp sqlite store, then print the summary and run ``finish()`` on them; the slow ones run the
real entry point."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from analysis.diagnose import overrides_text
from analysis.noise import judge, point_estimate
from analysis.report import MAX_WIDTH, finding_lines, merge_findings, merge_texts, print_sweep_summary
from analysis.report_view import Trial, headline
from orchestrator import sweep
from orchestrator.cli import finish
from orchestrator.config.schema import ParasweepConf
from orchestrator.config.validate import resolve_engine, resolve_engine_reason
from orchestrator.gpus import local_gpu_count
from orchestrator.store.tracking import Tracker
from orchestrator.trial.plan import TrialIdentity, checked_engine, make_plan
from orchestrator.trial.run import TrialRunSettings, execute_trial
from tests.conftest import run_cli, sqlite_store
from vocab.hardware import load_hardware
from vocab.metric_keys import point_metrics
from vocab.status import RunKind, Tag

EXPERIMENT = "summary"


def _cfg(tmp_path: Path, async_depth: int) -> ParasweepConf:
    cfg = ParasweepConf()
    cfg.engine.name = "sim"
    cfg.predict = True
    cfg.model.name, cfg.model.path = "tiny-test", "models/tiny-test"
    cfg.hardware = load_hardware("h200-nvlink-x8")
    cfg.pp.size, cfg.pp.async_depth = 2, async_depth
    cfg.workload.concurrency = [1, 4]
    cfg.workload.input_len, cfg.workload.output_len = 32, 8
    cfg.workload.requests_per_concurrency, cfg.workload.warmup_requests = 2, 1
    # predicted points stop at 0.3 virtual seconds: these tests are about a trial's stages and its
    # summary, not how sure a prediction is (tests/test_predicted_points.py)
    cfg.workload.predicted.budget_s = 0.3
    cfg.tracking.uri = sqlite_store(tmp_path / "mlflow.db")
    return cfg


@pytest.fixture(scope="module")
def predicted_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tracker, str, Path]:
    """Three trials (pp.async_depth=0,1,2: PP2 with the default micro-batch cap, so every trial has
    too few micro-batches at c4) under one sweep run, in virtual time."""
    tmp = tmp_path_factory.mktemp("summary")
    uri = _cfg(tmp, 0).tracking.uri
    tracker = Tracker(uri, EXPERIMENT)
    sweep_id = tracker.start_run("prediction pp.async_depth=0,1,2",
                                 {Tag.KIND: RunKind.SWEEP.value, Tag.MODE: "prediction"})
    for num, depth in enumerate((0, 1, 2)):
        cfg = _cfg(tmp, depth)
        label = f"pp.async_depth={depth}"
        plan = make_plan(cfg, checked_engine(cfg), TrialIdentity(num, label, tmp / str(num), (label,)))
        outcome = execute_trial(plan, TrialRunSettings(uri, EXPERIMENT, sweep_id, own_progress_view=False))
        assert outcome.status.value == "ok", outcome.error
    return tracker, sweep_id, tmp


def _printed(runs: list, width: int = MAX_WIDTH, uri: str | None = None) -> str:
    out = io.StringIO()
    print_sweep_summary(runs, "sweep x: 3 trial(s), status ok", Console(file=out, width=width), uri)
    return out.getvalue()


def _assert_fits(text: str, width: int = MAX_WIDTH) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, f"lines over {width} columns: {too_wide}"


def test_a_difference_within_the_noise_crowns_nothing(tmp_path: Path) -> None:
    # 140 against 100 tok/s, each ±30: the gap (40) is within their combined half-width (42)
    tracker, parent, _ = _measured_sweep(tmp_path / "mlflow.db", 30.0)
    text = _printed(tracker.children(parent), width=100)
    assert "*" not in text.split("Where")[0].replace("* best", "")
    flat = " ".join(text.split())
    assert ("c8: within noise, no trial marked: tok/s ±30 %; TTFT p99 ms ±4 %; ITL p99 ms noise unknown; "
            "J/tok ±30 %") in flat


def test_the_reports_headline_crowns_only_beyond_noise(tmp_path: Path) -> None:
    def line(half_width: float, db: str) -> str:
        tracker, parent, _ = _measured_sweep(tmp_path / db, half_width)
        runs = tracker.children(parent)
        line = headline([Trial(r, point_metrics(r.data.metrics), {}) for r in runs])
        assert line is not None
        return line.text

    clear = line(2.0, "narrow.db")
    assert clear.startswith("Highest output throughput at a valid point: 140")
    assert "ahead of the next" in clear
    noisy = line(30.0, "wide.db")
    assert "within noise (±30 %) of #0" in noisy and "no trial is measurably faster there" in noisy


def test_summary_fits_names_the_engine_and_marks_the_best(predicted_sweep) -> None:
    tracker, sweep_id, _ = predicted_sweep
    runs = tracker.children(sweep_id)
    text = _printed(runs)
    _assert_fits(text)
    assert all(r.data.tags[Tag.ENGINE_REASON] == "predict=true" for r in runs)
    header = "Simulated engine in virtual time (predict=true): the simulator's predictions, not measured"
    assert header in text.splitlines()
    # the c4 section: one row per trial; the highest tok/s carries the mark, and only it, when it beats
    # the next beyond the noise of both
    section = text[text.index("\nc4 "):].split("\n\n")[0].splitlines()
    rows = {int(m.group(1)): line for line in section if (m := re.search(r"#(\d) pp\.async_depth", line))}
    assert len(rows) == 3
    tok = {int(r.data.tags[Tag.TRIAL_NUM]): round(_at(r, "c4")["output_tok_s"], 1) for r in runs}
    best = max(tok.values())
    verdict = judge([point_estimate(_at(r, "c4"), "output_tok_s") for r in sorted(
        runs, key=lambda r: int(r.data.tags[Tag.TRIAL_NUM]))])
    clear = verdict is not None and verdict.clear
    for num, line in rows.items():
        cell = f"{tok[num]:.1f}*"
        assert (cell in line) == (clear and tok[num] == best and len(set(tok.values())) > 1), line
    assert clear or len(set(tok.values())) == 1 or "c4: within noise, no trial marked: tok/s" in text
    # J/token from the simulator's power model is shown, and says so
    assert "J/tok (sim)" in text and "simulator's power model, not measured" in text


def _at(run, point: str) -> dict[str, float]:
    return {str(label): m for label, m in point_metrics(run.data.metrics).items()}[point]


def test_findings_are_merged_across_trials_with_their_predicted_effect(predicted_sweep) -> None:
    tracker, sweep_id, tmp = predicted_sweep
    runs = tracker.children(sweep_id)
    diagnoses = [json.loads((tmp / str(n) / "diagnosis.json").read_text()) for n in range(3)]
    micro = [next(f for f in d if f["id"] == "too_few_microbatches") for d in diagnoses]
    text = _printed(runs)
    findings = text[text.index("Findings"):]
    lines = findings.splitlines()
    head = next(line for line in lines if "micro-batch" in line)
    severity = micro[0]["severity"]
    assert head.startswith(f"{severity.upper() if severity == 'critical' else severity}: all 3 trials: ")
    assert findings.count("micro-batch") == 1  # merged, not one per trial
    # the finding's indented lines, up to the next finding or the end of the section
    block = list(itertools.takewhile(lambda line: line.startswith(" "), lines[lines.index(head) + 1:]))
    body = " ".join(" ".join(block).split())
    assert body.startswith("→ ")
    effects = [f["predicted_effect"] for f in micro]
    if all(e and "change_pct" in e for e in effects):  # the change, then what it is predicted to do
        change = overrides_text(effects[0]["change"])  # as a command line writes it (true, not True)
        # where the trials' advice differs in more than its numbers (one's rejected change is "worse",
        # another's "negligible"), the first trial's is printed and said to be one of several
        shown = effects[:1] if "others differ" in body else effects
        numbers = merge_texts([f"{e['baseline']['output_tok_s']:.0f} → {e['predicted']['output_tok_s']:.0f} "
                               f"tok/s ({e['change_pct']['output_tok_s']:+.0f}%)" for e in shown])
        expected = f"set {change}: predicted {numbers}"
        if body.endswith("…"):  # cut short for width: what is shown is the start of it
            seen = body[body.index(f"set {change}: predicted "):].removesuffix("…").rstrip()
            assert expected.startswith(seen) and len(seen) > len(f"set {change}: predicted "), body
        else:
            assert expected in body, body
    # the same when diagnosis.json comes from the store, not the trial directory
    for run in runs:
        run.data.tags.pop(Tag.TRIAL_DIR)
    assert _printed(runs, uri=tracker.uri)[text.index("Findings"):] == findings


def test_merging_rules() -> None:
    assert merge_texts(["Stages idle 79% at c32", "Stages idle 86% at c32", "Stages idle 82% at c32"]) \
        == "Stages idle 79–86% at c32"
    assert merge_texts(["x +167% y", "x +168% y"]) == "x +167–168% y"
    assert merge_texts(["a b", "c d"], "trial #4") == "(trial #4; others differ) a b"
    effect = {"change": {"pp.micro_batch_size": 4}, "point": "c32", "predicted_at": "c32", "verdict": "helps",
              "baseline": {"output_tok_s": 91.0, "ttft_p99_ms": 1700.0, "itl_p99_ms": 270.0},
              "predicted": {"output_tok_s": 243.0, "ttft_p99_ms": 1000.0, "itl_p99_ms": 280.0},
              "change_pct": {"output_tok_s": 167.0, "ttft_p99_ms": -41.0, "itl_p99_ms": 3.7}}
    micro = {"id": "too_few_microbatches", "severity": "critical", "point": "c32", "title": "Only 1 at c32",
             "suggestion": "s", "change": {"pp.micro_batch_size": 4}, "predicted_effect": effect}
    bubble = {**micro, "id": "pp_bubble", "title": "Idle 86% at c32"}
    queue = {"id": "admission_cap", "severity": "warning", "point": "c8", "title": "Queue at c8",
             "suggestion": "Raise the cap. More words.", "change": {}, "predicted_effect": None}
    failed = {"id": "trial_failed", "severity": "critical", "title": "x"}
    bubble_1 = {**bubble, "title": "Idle 79% at c32"}
    merged = merge_findings([(0, [queue, micro, bubble]), (1, [micro, bubble_1]), (2, [micro, failed])])
    assert [m.id for m in merged] == ["too_few_microbatches", "pp_bubble", "admission_cap"]
    lines = finding_lines(merged, 3, 100)
    assert lines[:4] == [
        "CRITICAL: all 3 trials: Only 1 at c32",
        "  → set pp.micro_batch_size=4: predicted 91 → 243 tok/s (+167%), TTFT p99 -41%",
        "CRITICAL: trials #0, #1: Idle 79–86% at c32",
        "  → the same change as above: pp.micro_batch_size=4"]
    assert lines[4:] == ["warning: trial #0: Queue at c8", "  → Raise the cap"]
    assert all(len(line) <= 40 for line in finding_lines(merged, 3, 40))


def _measured_sweep(db: Path, half_width: float, pred_half_width: float | None = None
                    ) -> tuple[Tracker, str, str]:
    """Trials as an SGLang sweep with NVML telemetry records them, each number with a 95 % interval of
    ``half_width`` tok/s (and a TTFT p99 interval as wide in ms); the model's throughput beside it,
    with an interval of ``pred_half_width`` where given."""
    tracker = Tracker(sqlite_store(db), EXPERIMENT)
    parent = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value})
    long_label = "parallelism=tp2pp4 server.max_running_requests=512 workload.concurrency=[8,32,128]"
    trials = [(100.0, 2.5, "ok"), (140.0, 1.9, "ok"), (0.0, 0.0, "failed")]
    for num, (tok, joule, status) in enumerate(trials):
        run_id = tracker.start_run(f"#{num}", {
            Tag.KIND: RunKind.TRIAL.value, Tag.STATUS: status, Tag.TRIAL_NUM: str(num),
            Tag.OVERRIDES: f"{long_label} pp.async_depth={num}", Tag.ENGINE: "sglang",
            Tag.ENGINE_VERSION: "0.5.4", Tag.ENGINE_REASON: "engine=auto: 8 GPU(s) and SGLang on this node",
            Tag.GPU_TELEMETRY: "nvml", **({Tag.ERROR: "Traceback\nEngineStartError: out of memory"}
                                          if status == "failed" else {})}, parent)
        if status == "ok":
            ttft = 900.0 - tok
            tracker.log_metrics(run_id, [("c8/output_tok_s", tok, 0), ("c8/ttft_p99_ms", ttft, 0),
                                         ("c8/output_tok_s_ci95", half_width, 0),
                                         ("c8/output_tok_s_ci95_rel", half_width / tok, 0),
                                         ("c8/ttft_p99_ms_ci95_lo", ttft - half_width, 0),
                                         ("c8/ttft_p99_ms_ci95_hi", ttft + half_width, 0),
                                         ("c8/itl_p99_ms", 30.0, 0), ("c8/j_per_output_token", joule, 0),
                                         ("c8/valid", 1.0, 0), ("pred/c8/output_tok_s", tok * 0.9, 0)])
            if pred_half_width is not None:
                tracker.log_metrics(run_id, [("pred/c8/output_tok_s_ci95", pred_half_width, 0)])
    return tracker, parent, long_label


def test_the_trials_apart_beyond_noise_and_what_became_of_the_models_gaps(tmp_path: Path) -> None:
    # measured 140 against 100 tok/s; the model 126 against 90 (+40 %), ±3: a gap beyond its noise
    tracker, parent, _ = _measured_sweep(tmp_path / "narrow.db", 2.0, pred_half_width=3.0)
    flat = " ".join(_printed(tracker.children(parent), width=100).split())
    assert "c8 tok/s apart beyond noise: #1 > #0 +40 %; the other pairs within it" in flat
    assert "c8 tok/s, the model's gaps: #1 > #0 +40 % confirmed" in flat
    # ±30 each: the measured +40 % is within ±42 %, which also holds the model's +40 %
    tracker, parent, _ = _measured_sweep(tmp_path / "wide.db", 30.0, pred_half_width=3.0)
    flat = " ".join(_printed(tracker.children(parent), width=100).split())
    assert "c8 tok/s: no two trials apart beyond noise" in flat
    assert "c8 tok/s, the model's gaps: #1 > #0 +40 % not resolved (measured +40 % ±42 %)" in flat
    # the model's numbers logged without their intervals: it cannot say what it puts apart
    tracker, parent, _ = _measured_sweep(tmp_path / "bare.db", 2.0)
    assert "the model's gaps" not in _printed(tracker.children(parent), width=100)


def test_measured_trials_show_measured_energy_and_failures_within_the_width(tmp_path: Path) -> None:
    """Trials as an SGLang sweep with NVML telemetry records them: J/token plain, the lowest marked;
    a failed trial's reason on its own line; a long label folds inside its column."""
    tracker, parent, long_label = _measured_sweep(tmp_path / "mlflow.db", 2.0)
    text = _printed(tracker.children(parent), width=80)
    _assert_fits(text, 80)
    assert "Engine sglang 0.5.4 (engine=auto: 8 GPU(s) and SGLang on this node): measured" in text
    assert "Simulated" not in text and "(sim)" not in text and "J/tok" in text
    assert "140.0* (126.0)" in text and "1.90*" in text and "2.50*" not in text
    assert "ITL p99" in text and "30.0*" not in text  # all equal: nothing to mark
    # the equal ITLs (no interval recorded) are the only column nothing is marked in
    assert "c8: within noise, no trial marked: ITL p99 ms noise unknown" in " ".join(text.split())
    flat = " ".join(text.split())  # the failure line wraps at 80 columns
    assert f"failed #2 {long_label} pp.async_depth=2: EngineStartError: out of memory" in flat


def test_engine_reason_says_why(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 0)
    assert resolve_engine_reason(cfg) == ("sim", "engine=sim in the config")
    cfg.engine.name = "auto"
    engine, reason = resolve_engine_reason(cfg)
    assert engine == resolve_engine(cfg) and reason.startswith("engine=auto: ")
    if local_gpu_count() == 0:
        assert (engine, reason) == ("sim", "engine=auto: no NVIDIA GPU on this node")
    else:
        assert "GPU(s)" in reason


@pytest.mark.slow  # finish(): every plot and the report
def test_finish_prints_where_things_are_and_keeps_the_report(predicted_sweep, monkeypatch, capsys) -> None:
    tracker, sweep_id, tmp = predicted_sweep
    sweep_dir = tmp / "sweep"
    sweep_dir.mkdir(exist_ok=True)
    state = sweep.SweepState(tracker.uri, EXPERIMENT, str(sweep_dir), True, "prediction", sweep_id,
                             tracker.experiment_id)
    monkeypatch.setattr(sweep, "ACTIVE", state)
    monkeypatch.chdir(tmp)
    assert finish(0) == 0
    out = capsys.readouterr().out
    _assert_fits(out)
    assert "prediction (virtual time, simulated engine)" in out and "Findings" in out
    assert "Browse the runs in the MLflow UI (from this directory):" in out
    assert "  mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000" in out
    assert "Trial files: sweep/<n>/" in out
    # what to run instead, once: the trials' own layout (PP2 of a tiny model on two GPUs) loses to
    # another split of the same two GPUs at both loads, in prediction, and its command lines follow
    answer = json.loads((sweep_dir / "instead.json").read_text())
    change = answer["recommend"]["change"]
    flat = " ".join(out.split())
    assert out.count("Run this instead: ") == 1 and "predicted better than every trial at c1 and c4" in flat
    assert change.get("pp.size") == 1 and change.get("pp.async_depth") in (None, 0)
    lines = out.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("  python run.py "))
    end = next(i for i in range(first, len(lines)) if not lines[i].endswith("\\"))
    command = " ".join(x.removesuffix("\\").strip() for x in lines[first:end + 1])  # wrapped for width
    assert "workload.concurrency=[1,4]" in command and "pp.size=1" in command
    assert "pp.async_depth=0" in command  # the base's own, or the change's: leaving the pipeline resets it
    assert "python -m sglang.launch_server" in out
    names = [a.path for a in tracker.client.list_artifacts(sweep_id)]
    assert "instead.json" in names
    report = sweep_dir / "report.html"
    if report.exists():  # analysis/report_html.py writes it; finish() goes on without it
        assert "Report: sweep/report.html" in out
        assert "report.html" in names
        assert "Run this instead: " in report.read_text()


# -- the real entry point --------------------------------------------------------------------------
@pytest.mark.slow
def test_help_opens_with_parasweep_and_lists_the_groups(tmp_path: Path) -> None:
    result = run_cli(["--help"], tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("parasweep: ") and "powered by Hydra" not in out
    for command in ("make demo", "predict=true", "dry_run=true", "reproduce=", "calibration=",
                    "python -m analysis report", "python -m analysis compare",
                    "python -m orchestrator calibrate"):
        assert command in out, command
    groups = out[out.index("== Config groups"):]
    for group in ("engine:", "model:", "hardware:", "parallelism:", "workload:", "experiment:"):
        assert f"\n{group} " in groups, group
    assert "pp:\n  size:" in out  # the config keys follow
    _assert_fits(out[:out.index("== Config keys")])


def test_a_time_scaled_simulated_engine_is_said_under_the_engine_line(tmp_path: Path) -> None:
    from analysis.report import engine_lines

    tracker = Tracker(sqlite_store(tmp_path / "mlflow.db"), EXPERIMENT)
    parent = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value})
    for num, scale in enumerate(("4", "")):  # a trial at 4x real time, one in real time (no tag)
        tags = {Tag.KIND: RunKind.TRIAL.value, Tag.TRIAL_NUM: str(num), Tag.ENGINE: "sim",
                Tag.ENGINE_REASON: "engine=sim in the config"}
        tracker.start_run(f"#{num}", {**tags, **({Tag.SIM_TIME_SCALE: scale} if scale else {})}, parent)
    lines = engine_lines(tracker.children(parent))
    assert lines[0] == "Simulated engine (engine=sim in the config): the simulator's numbers, not measured"
    assert " ".join(line.strip() for line in lines[1:3]) == (
        "played at 4x real time (engine.time_scale) and timed on its own clock: every time and rate is in "
        "the engine's seconds")
    assert all(len(line) <= MAX_WIDTH for line in lines)
