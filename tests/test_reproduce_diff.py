"""reproduce= says what differs: every trial's environment fingerprint (env.json), reproduction from a
run id or a path, and the side-by-side of metrics and environments when the new trial ends.

The trials here run in virtual time through ``execute_trial`` against a real sqlite MLflow store; the
command-line tests at the end run the real entry point (slow)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy
import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from orchestrator.environment import PACKAGES, fingerprint, git_state
from orchestrator.errors import UserError
from orchestrator.reproduce import WIDTH, expand_reproduce, reproduction_report
from orchestrator.store.tracking import Tracker
from orchestrator.trial.run import TrialRunSettings, execute_trial
from tests.conftest import run_cli, sqlite_store
from tests.test_trial_stages import plan_for, tiny_cfg
from vocab.metric_keys import point_metrics
from vocab.status import RunKind, Tag, TrialStatus

EXPERIMENT = "reproduce"
FIELDS = {"parasweep", "git_commit", "git_dirty", "python", "python_implementation", "packages", "engine",
          "engine_version", "gpus", "gpu_driver", "cuda_driver", "os", "kernel", "machine", "cpu",
          "cpu_count", "hardware", "host", "ray_node_id", "gpu_uuids"}


# -- the fingerprint -------------------------------------------------------------------------------
def test_fingerprint_has_every_field_from_this_interpreter() -> None:
    env = fingerprint("sim", {"engine": "parasweep-sim", "version": "9.9"}, "h200-nvlink-x8", None)
    assert set(env) == FIELDS
    assert set(env["packages"]) == set(PACKAGES)
    assert env["packages"]["numpy"] == numpy.__version__  # read from metadata, checked against the module
    assert env["python"] == platform.python_version()
    assert env["python_implementation"] == platform.python_implementation()
    assert env["engine"] == "sim" and env["engine_version"] == "parasweep-sim 9.9"
    assert env["hardware"] == "h200-nvlink-x8" and env["cpu_count"] == os.cpu_count()
    assert env["kernel"] == platform.release()
    # real GPUs are listed by model; without NVML every GPU field says "none" (and why, for gpus)
    if isinstance(env["gpus"], str):
        assert env["gpus"].startswith("none (") and env["gpu_driver"] == env["cuda_driver"] == "none"
    else:
        assert env["gpus"] and env["cuda_driver"].count(".") == 1
    json.dumps(env)  # it goes to env.json as it is


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def _repo_with_one_commit(tmp_path: Path) -> Path:
    """A git repository holding a.py (x = 1) in one commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def test_git_state_sees_the_commit_and_a_dirty_tree(tmp_path: Path) -> None:
    repo = _repo_with_one_commit(tmp_path)
    assert git_state(repo) == {"git_commit": _git(repo, "rev-parse", "HEAD"), "git_dirty": False}
    (repo / "a.py").write_text("x = 2\n")  # an edit
    assert git_state(repo)["git_dirty"] is True
    _git(repo, "checkout", "-q", "a.py")
    assert git_state(repo)["git_dirty"] is False
    (repo / "b.py").write_text("y = 1\n")  # a new module changes what runs too
    assert git_state(repo)["git_dirty"] is True
    # outside git, and a folder inside someone else's checkout (a venv in a project), are unknown
    assert git_state(tmp_path) == {"git_commit": "unknown", "git_dirty": "unknown"}
    (repo / "sub").mkdir()
    assert git_state(repo / "sub")["git_commit"] == "unknown"


def test_git_state_never_writes_the_index(tmp_path: Path) -> None:
    # trials side by side read the same checkout: a status that refreshed .git/index would take
    # index.lock, and the others would then report "unknown"
    repo = _repo_with_one_commit(tmp_path)
    index = repo / ".git" / "index"
    old = index.stat().st_mtime - 60
    os.utime(index, (old, old))
    later = old + 30  # same content, newer stat: a plain `git status` would refresh the index
    os.utime(repo / "a.py", (later, later))
    before = index.read_bytes()
    assert git_state(repo)["git_dirty"] is False
    assert index.stat().st_mtime == old and index.read_bytes() == before
    (repo / ".git" / "index.lock").write_text("")  # another process holds the lock
    assert git_state(repo) == {"git_commit": _git(repo, "rev-parse", "HEAD"), "git_dirty": False}


# -- trials in virtual time ------------------------------------------------------------------------
@dataclass
class Original:
    tracker: Tracker
    uri: str
    run_id: str
    trial_dir: Path
    sweep_id: str


def _trial(tmp: Path, name: str, uri: str, reproduces: str | None = None, parent: str | None = None,
           output_len: int = 8) -> tuple[str, Path]:
    cfg = tiny_cfg(tmp)
    cfg.tracking.uri, cfg.predict, cfg.workload.output_len = uri, True, output_len
    plan = plan_for(cfg, tmp / name)
    settings = TrialRunSettings(uri, EXPERIMENT, parent_run_id=parent, reproduces=reproduces,
                                own_progress_view=False)
    outcome = execute_trial(plan, settings)
    assert outcome.status is TrialStatus.OK, outcome.error
    assert outcome.run_id
    return outcome.run_id, tmp / name / "trial"


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Original:
    """One predicted trial, the child of a sweep run, in a fresh store."""
    tmp = tmp_path_factory.mktemp("original")
    uri = sqlite_store(tmp / "mlflow.db")
    tracker = Tracker(uri, EXPERIMENT)
    sweep_id = tracker.start_run("sweep", {Tag.KIND: RunKind.SWEEP.value})
    run_id, trial_dir = _trial(tmp, "first", uri, parent=sweep_id)
    return Original(tracker, uri, run_id, trial_dir, sweep_id)


def _artifact(tracker: Tracker, run_id: str, name: str, tmp: Path) -> str:
    return Path(tracker.client.download_artifacts(run_id, name, str(tmp))).read_text()


def test_each_trial_writes_and_logs_its_environment(original: Original, tmp_path: Path) -> None:
    written = json.loads((original.trial_dir / "env.json").read_text())
    assert set(written) == FIELDS
    assert written["engine"] == "sim-predict" and written["hardware"] == "h200-nvlink-x8"
    assert written["engine_version"].startswith("parasweep-sim ")
    assert json.loads(_artifact(original.tracker, original.run_id, "env.json", tmp_path)) == written


def _check_lines(lines: list[str]) -> None:
    assert lines and all(len(line) <= WIDTH for line in lines), [len(x) for x in lines]


def test_side_by_side_of_metrics_and_environment(original: Original, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    client = original.tracker.client
    old_id, _ = _trial(tmp_path, "old", original.uri)  # its own original: this one is altered below
    # the original ran elsewhere: another numpy (its env.json artifact is replaced, as a store holds it)
    env = json.loads(_artifact(original.tracker, old_id, "env.json", tmp_path))
    env["packages"]["numpy"] = "0.0.1"
    client.log_text(old_id, json.dumps(env), "env.json")
    capsys.readouterr()
    # shorter answers change the throughput, so each metric has a change to show
    new_id, new_dir = _trial(tmp_path, "again", original.uri, reproduces=old_id, output_len=4)
    printed = capsys.readouterr().out.splitlines()
    lines = (new_dir / "reproduction.txt").read_text().splitlines()
    assert lines == printed[printed.index(lines[0]):][:len(lines)]  # printed as logged
    _check_lines(lines)
    assert _artifact(original.tracker, new_id, "reproduction.txt", tmp_path).splitlines() == lines
    run = client.get_run(new_id)
    assert run.data.tags[Tag.REPRODUCE_DIFF] == lines[0] and run.data.tags[Tag.REPRODUCES] == old_id
    assert lines[0].startswith("reproduction: tok/s ") and "env: 1 difference(s)" in lines[0]
    header = next(line for line in lines if "metric" in line)
    assert header.split() == ["point", "metric", "original", "new", "change"]
    old = point_metrics(client.get_run(old_id).data.metrics)
    new = point_metrics(run.data.metrics)
    rows = {(p.split()[0], p.split()[1]): p.split()[2:] for p in lines[lines.index(header) + 1:]
            if p.startswith("  c")}
    for point in old:
        for metric in ("output_tok_s", "ttft_p99_ms", "itl_p99_ms", "j_per_output_token"):
            a, b = old[point][metric], new[point][metric]
            values = rows[(str(point), metric)]
            # a change that rounds to zero reads +0.0%
            assert values[2] == f"{(b - a) / a * 100:+.1f}%".replace("-0.0%", "+0.0%"), (metric, values)
            assert float(values[0]) == pytest.approx(a, rel=0.01)
            assert float(values[1]) == pytest.approx(b, rel=0.01)
    assert new[min(new)]["output_tok_s"] != old[min(old)]["output_tok_s"]
    assert f"    packages.numpy: 0.0.1 -> {numpy.__version__}" in lines


def test_a_trial_of_a_reproduced_sweep_is_compared_with_its_namesake(original: Original,
                                                                     tmp_path: Path) -> None:
    new_id, _ = _trial(tmp_path, "redo", original.uri, reproduces=original.sweep_id)
    lines = reproduction_report(original.tracker, original.sweep_id, new_id)
    _check_lines(lines)
    assert lines[1].startswith(f"original: run {original.run_id} ")
    assert any(line.split()[:2] == ["c4", "output_tok_s"] and line.endswith("+0.0%") for line in lines)


def test_an_original_from_before_fingerprints_says_so(original: Original) -> None:
    old_id = original.tracker.start_run("old", {Tag.KIND: RunKind.TRIAL.value})
    original.tracker.log_metrics(old_id, [("c1/output_tok_s", 100.0, 0), ("c1/ttft_p99_ms", 50.0, 0)])
    lines = reproduction_report(original.tracker, old_id, original.run_id)
    _check_lines(lines)
    assert "  environment: original has no environment fingerprint" in lines
    assert "original has no env.json" in lines[0]
    ours = point_metrics(original.tracker.client.get_run(original.run_id).data.metrics)
    c1 = ours[min(ours)]
    row = next(line for line in lines if line.split()[:2] == ["c1", "output_tok_s"])
    assert row.split()[-1] == f"{(c1['output_tok_s'] - 100.0) / 100.0 * 100:+.1f}%"
    assert any(line.split()[:2] == ["c4", "output_tok_s"] and line.split()[2] == "-" for line in lines)


def test_side_by_side_from_a_trial_directory(original: Original, tmp_path: Path) -> None:
    copy = tmp_path / "copied-trial"
    shutil.copytree(original.trial_dir, copy)
    env = json.loads((copy / "env.json").read_text())
    env["cpu"] = "a CPU from elsewhere"
    (copy / "env.json").write_text(json.dumps(env))
    lines = reproduction_report(original.tracker, str(copy), original.run_id)
    _check_lines(lines)
    assert lines[0] == "reproduction: original's metrics not available; env: 1 difference(s)"
    assert any("original's metrics are not available" in line for line in lines)
    here = json.loads((original.trial_dir / "env.json").read_text())["cpu"]
    assert f"    cpu: a CPU from elsewhere -> {here}" in lines
    # a config/ folder inside it finds the env.json beside it; one downloaded on its own has none
    assert reproduction_report(original.tracker, str(copy / "config"), original.run_id)[0] == lines[0]
    alone = tmp_path / "downloaded" / "config"
    shutil.copytree(copy / "config", alone)
    assert "original has no environment fingerprint" in "\n".join(
        reproduction_report(original.tracker, str(alone), original.run_id))


# -- expanding reproduce=<path> --------------------------------------------------------------------
def test_reproduce_a_path_expands_to_its_overrides(original: Original, tmp_path: Path) -> None:
    recorded = yaml.safe_load((original.trial_dir / "config" / "overrides.yaml").read_text())
    for target in (original.trial_dir, original.trial_dir / "config"):
        args = expand_reproduce([f"reproduce={target}", "workload.output_len=4"])
        assert args == [*recorded, "workload.output_len=4", f"reproduce={target.resolve()}"]
    # a path Hydra cannot take bare is quoted, and Hydra reads it back unchanged
    odd = tmp_path / "it's a, trial"
    shutil.copytree(original.trial_dir / "config", odd / "config")
    last = expand_reproduce([f"reproduce={odd}"])[-1]
    assert OverridesParser.create().parse_overrides([last])[0].value() == str(odd.resolve())


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p / "missing", "no such folder"),
    (lambda p: p, "the folder has neither config/overrides.yaml nor overrides.yaml"),
    (lambda p: (p / "f.txt", (p / "f.txt").write_text("x"))[0], "no such folder"),
])
def test_a_bad_path_is_one_line(tmp_path: Path, make, says: str) -> None:  # type: ignore[no-untyped-def]
    target = make(tmp_path)
    with pytest.raises(UserError) as err:
        expand_reproduce([f"reproduce={target}"])
    message = str(err.value)
    assert message.startswith(f"reproduce={target}: {says}") and "\n" not in message
    assert "trial directory" in message  # says what is valid


def test_an_overrides_file_that_is_not_a_list_is_refused(tmp_path: Path) -> None:
    (tmp_path / "overrides.yaml").write_text("model: tiny-test\n")
    with pytest.raises(UserError, match=r"overrides.yaml holds a dict; valid: the YAML list"):
        expand_reproduce([f"reproduce={tmp_path}"])


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.slow
def test_reproduce_from_the_command_line(tmp_path: Path) -> None:
    """From a run id (with the original's trial directory gone, from another folder: only the store is
    shared), from a trial directory and from a config/ folder; a bad path is one line, exit 2."""
    from mlflow.tracking import MlflowClient

    first = run_cli(["predict=true", "model=tiny-test", "parallelism=pp2", "workload=tiny"], tmp_path,
                    store=True)
    assert first.returncode == 0, first.stdout + first.stderr
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("parasweep")
    (trial,) = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'prediction'")
    trial_dir = Path(trial.data.tags[Tag.TRIAL_DIR])
    kept = tmp_path / "kept-trial"
    shutil.copytree(trial_dir, kept)
    shutil.rmtree(trial_dir)
    elsewhere = tmp_path / "clean-checkout"
    elsewhere.mkdir()

    again = run_cli([f"reproduce={trial.info.run_id}", f"tracking.uri={uri}"], elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    out = again.stdout.splitlines()
    assert any(line.startswith("reproduction: tok/s +0.0%") for line in out), again.stdout
    assert "  environment: no differences" in out
    assert any(line.split()[:2] == ["c4", "itl_p99_ms"] and line.endswith("+0.0%") for line in out)

    for target in (kept, kept / "config"):
        result = run_cli([f"reproduce={target}", f"tracking.uri={uri}"], elsewhere)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "reproduction: original's metrics not available; env: no differences" in result.stdout
        newest = client.search_runs([exp.experiment_id], "tags.`parasweep.kind` = 'prediction'",
                                    order_by=["attributes.start_time DESC"])[0]
        assert newest.data.tags[Tag.REPRODUCES] == str(target.resolve())
        assert newest.data.params["model.name"] == "tiny-test" and newest.data.params["pp.size"] == "2"

    bad = run_cli([f"reproduce={tmp_path / 'nowhere'}"], elsewhere, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith(f"parasweep: reproduce={tmp_path / 'nowhere'}: no such folder")
