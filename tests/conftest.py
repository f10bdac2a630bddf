"""Shared helpers: run parasweep's real entry point as a subprocess from a scratch directory, and give
tests real MLflow sqlite stores without paying MLflow's schema migrations for each one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An empty MLflow store, created once per test session (MLflow's ~40 schema migrations take about 2 s
# of CPU for each new sqlite file) and copied wherever a test needs a store: the copy is the same real
# store MLflow would have created, opened without migrating (docs/testing.md). It lives in pytest's own
# temporary directory of this session, shared by the xdist workers (the first makes it, under a lock),
# so nothing depends on an earlier run. Its folder is passed in the environment: pytest loads this file
# as ``conftest`` while test modules import it as ``tests.conftest``, two modules with their own globals.
_TEMPLATE_HOME = "PARASWEEP_TEST_STORE_TEMPLATE_DIR"


@pytest.fixture(scope="session", autouse=True)
def _session_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    # an xdist worker's base is popen-gwN inside the session's; the session's is shared by all workers
    os.environ[_TEMPLATE_HOME] = str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def _template() -> Path:
    from filelock import FileLock

    folder = Path(os.environ[_TEMPLATE_HOME])
    template = folder / "mlflow-template.db"
    with FileLock(f"{template}.lock"):
        if not template.exists():
            from mlflow.tracking import MlflowClient

            scratch = folder / f"mlflow-template-{os.getpid()}.db"
            MlflowClient(tracking_uri=f"sqlite:///{scratch}").search_experiments()  # the tables
            scratch.rename(template)  # whole or not at all, for the other workers
    return template


def sqlite_store(path: Path) -> str:
    """The tracking URI of the MLflow sqlite store at ``path`` (a file): the store already there, or a
    new, empty one (a copy of the template)."""
    if not path.exists():
        template = _template()
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
    return f"sqlite:///{path}"


# A sweep whose test reads its numbers, not its drawings, ends without them (report.plots, report.html):
# drawing every trial's plots and the HTML report costs the driver a second or more of CPU per trial
# (tests/test_sweep_finish.py checks both settings; the end-to-end, report and outage tests draw).
NO_DRAWING = ["report.plots=false", "report.html=false"]


# A command's timeout only guards against a hang: never below this, so a machine several times
# oversubscribed (a CI runner beside other jobs) still finishes a sweep a quiet one runs in a minute.
# A run of three Ray trials beside two CPU burners and two other jobs took over 300 s.
HANG_GUARD_S = 1200.0


def run_cli(args: list[str], cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
            store: bool = False) -> subprocess.CompletedProcess[str]:
    """``python run.py ARGS`` with cwd (hence runs/) in a scratch directory. ``store``: start from an
    empty store at runs/mlflow.db (as after an earlier run) instead of letting the run create it.
    ``timeout``: a hang guard, at least ``HANG_GUARD_S``."""
    if store:
        sqlite_store(cwd / "runs" / "mlflow.db")
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=max(timeout, HANG_GUARD_S), env=full_env, check=False)


def kill_server_mid_point(args: list[str], cwd: Path, ready: str, pgid_file: str) -> tuple[int, Path]:
    """``python run.py ARGS`` in ``cwd``, one of its servers killed (SIGKILL to the process group that
    ``server/<pgid_file>`` names) once the speaking server's log (``server/server.log``) shows ``ready``;
    the run's exit code and its ``error.txt``."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        pgid = None
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list(cwd.glob("runs/outputs/**/server/server.log"))
            if logs and ready in logs[0].read_text():
                pgid = int((logs[0].parent / pgid_file).read_text())
                break
            time.sleep(0.2)
        assert pgid is not None, f"the trial's log never showed {ready!r}"
        os.killpg(pgid, signal.SIGKILL)
        proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    (error,) = cwd.glob("runs/outputs/**/error.txt")
    return proc.returncode, error


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def refusal(cfg: object) -> str:
    """The one-line message ``validate`` refuses ``cfg`` with (the test fails if it accepts it)."""
    from orchestrator.config.validate import validate
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        validate(cfg)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- parallel runs (pytest-xdist, `make test`) -------------------------------------------------------
# The longest unit of the suite, measured serially on a 2-core machine (docs/testing.md), handed out first
# so that it does not start last and run alone at the end. Only this one: the suite is CPU-bound on two
# cores, and starting every long (CPU-heavy) test at once made each slower than the sum it saved.
LONGEST_FIRST = ("tests/test_sweep_load.py",)  # 50 trials


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture of its own module (made once per module)."""
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::", 1)[0]
    return info is not None and any(
        d.scope == "module" and d.baseid == module for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (the fast tier), the tests of a module that shares a module-scoped
    fixture stay on one worker (the fixture is made once); every other test goes wherever a worker is
    free. Under ``--dist loadscope`` (the full suite) every module is one unit anyway. The longest unit
    goes first. The order is the same in every worker, as xdist requires."""
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
                    len(LONGEST_FIRST))

    for item in items:
        if _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items.sort(key=rank)  # stable: within a unit, the module's own order
