"""``pip install .`` (not editable) gives working packages: the simulator, the load generator and the
shipped hardware profiles and model configs are found from the installed copy, away from the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # builds and installs the project


def _tracked_copy(dst: Path) -> Path:
    """The checkout's tracked files, so pip's in-tree build leaves nothing behind in the repository."""
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in names.stdout.splitlines():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dst / name)
    return dst


def test_a_plain_install_works_outside_the_checkout(tmp_path: Path) -> None:
    target = tmp_path / "site"
    source = _tracked_copy(tmp_path / "src")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", str(target), str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr
    assert not (target / "vocab" / "__editable__").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = ("import vocab, simulator, workloads\n"
             "from vocab.assets import conf_dir, model_dir\n"
             "from vocab.hardware import load_hardware\n"
             "from vocab.model import read_model_info\n"
             "print(vocab.__file__); print(conf_dir())\n"
             "print(load_hardware('h200-nvlink-x8').gpu)\n"
             "print(read_model_info(model_dir('models/kimi-k2')).num_layers)\n"
             "from workloads.sources.traces import read_trace\n"
             "print(read_trace('mooncake', None).path); print(len(read_trace('azure', None)))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(str(target)) and lines[1].startswith(str(target))
    assert lines[2] == "NVIDIA H200 SXM 141GB" and lines[3] == "61"
    # the trace slices are package data too, with their provenance beside them
    assert lines[4].startswith(str(target / "parasweep_traces" / "mooncake")) and lines[5] == "1000"
    assert (target / "parasweep_traces" / "mooncake" / "LICENSE").is_file()
    assert (target / "parasweep_traces" / "azure" / "README.md").is_file()
    sim = subprocess.run([sys.executable, "-m", "simulator", "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert sim.returncode == 0 and "--sim-hardware" in sim.stdout, sim.stderr
