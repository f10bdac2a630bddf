"""The architecture's rules, checked on the code itself: import layers and acyclic packages (the
import-linter contracts in pyproject.toml), no reach into another module's private names, no
``sys.path`` edits, every package installed, and a repository that points at no outside documents."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("vocab", "workloads", "simulator", "analysis", "orchestrator", "hydra_plugins")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _project_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


def test_import_contracts_are_kept() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout or "broken" not in result.stdout.lower()


def _copy_tree(dst: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    return dst


@pytest.mark.parametrize(("module", "line", "contract"), [
    # the bottom layer reaching up: a layers violation
    ("vocab/records.py", "import orchestrator.trial\n", "Layers"),
    # the simulator and analysis must stay unaware of each other
    ("simulator/costs.py", "from analysis import diagnose\n", "Layers"),
    # a loop between two modules of one package
    ("workloads/metrics.py", "from workloads import cli\n", "No cycles"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = _copy_tree(tmp_path)
    path = root / module
    path.write_text(path.read_text() + "\n" + line)
    result = _lint_imports(root)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout


def _private_imports(source: str) -> list[str]:
    """``from X import _name``: a reach into another module's private names (line: module.name)."""
    return [f"{node.lineno}: {node.module}.{alias.name}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_module_imports_another_modules_private_names() -> None:
    found = [f"{path.relative_to(REPO)}:{hit}" for path in _project_files()
             for hit in _private_imports(path.read_text())]
    assert not found, "\n".join(found)


def test_the_private_name_check_can_fail() -> None:
    source = "import os\nfrom orchestrator.engines.sglang_compat.command import _plain, flatten\n"
    assert _private_imports(source) == ["2: orchestrator.engines.sglang_compat.command._plain"]


def test_no_code_edits_sys_path() -> None:
    offenders = []
    for path in [*_project_files(), *(REPO / "tests").glob("*.py"), *(REPO / "benchmarks").glob("*.py"),
                 REPO / "run.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_every_package_is_installed() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(p.parent.relative_to(REPO)).replace("/", ".") for pkg in PACKAGES
             for p in (REPO / pkg).rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
    # every config group is a data package of its own (setuptools installs a folder's files only then)
    groups = {f"parasweep_conf.{d.name}" for d in (REPO / "conf").iterdir()
              if d.is_dir() and any(d.glob("*.yaml"))}
    assert {"parasweep_conf", "parasweep_models"} | groups <= listed, sorted(groups - listed)


# Built from pieces so that this file does not match itself.
OUTSIDE_DOCS = re.compile("|".join([
    "DESIGN" + r"\.md", "shared" + "/reference", r"\.\./" + "shared",
    r"\b(sglang|simulation|ecosystem|peers)" + r"\.md\b", r"\bissues? " + r"#?\d+\b"]), re.IGNORECASE)


def test_the_repository_points_at_no_outside_documents() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    hits = []
    for name in tracked.stdout.splitlines():
        path = REPO / name
        if path.suffix not in (".py", ".md", ".yaml", ".toml", ".txt", ".sh", "") or not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_DOCS.search(line):
                hits.append(f"{name}:{lineno}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)
