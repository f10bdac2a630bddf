"""The environment a trial ran in, as one flat-ish dict (``env.json`` in the trial directory and as a
run artifact), so a reproduction can say what differs besides the config.

What is recorded: parasweep's version and git state, Python, the versions of the packages that shape a
measurement (read from package metadata, never imported: importing torch or sglang costs seconds and
can touch the GPUs), the engine and its version as ``/server_info`` reports it, the trial's GPUs with
the driver and CUDA versions (NVML), the OS, kernel and CPU, and the hardware profile's name.

Every probe degrades to a word ("unknown", "none", "not installed") instead of failing: a missing
fingerprint entry must never cost a trial its results.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from vocab.status import PLACEMENT_TAGS

# Distribution names as pip knows them; where a package ships under two names, the first installed wins.
PACKAGES: dict[str, tuple[str, ...]] = {
    "hydra-core": ("hydra-core",), "omegaconf": ("omegaconf",), "ray": ("ray",),
    "mlflow": ("mlflow", "mlflow-skinny"), "aiohttp": ("aiohttp",), "pandas": ("pandas",),
    "numpy": ("numpy",), "nvidia-ml-py": ("nvidia-ml-py", "pynvml"), "sglang": ("sglang",),
    "torch": ("torch",), "smg": ("smg",)}  # smg: the router in front of DP replicas (dp.router_impl)
NOT_INSTALLED = "not installed"
ENV_FILE = "env.json"  # in the trial directory, and at the top of the run's artifacts
GIT_TIMEOUT_S = 5.0
# The checkout this code runs from (when it runs from one: an installed copy has no git state).
SOURCE_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def engine_version(info: dict) -> str:
    """``sglang 0.5.23``, ``parasweep-sim 0.5.23`` or ``parasweep-sim playing vllm 0.34.0``: the engine
    and the release it is (or plays), as the server says of itself."""
    version = info.get("version", "unknown")
    engine = f"{info['engine']} playing {info['plays']}" if info.get("plays") else info.get("engine")
    return f"{engine} {version}" if engine else str(version)


def fingerprint(engine_name: str, server_info: dict[str, Any], hardware_name: str,
                visible_devices: str | None, where: dict[str, str] | None = None) -> dict[str, Any]:
    """The trial's environment. ``visible_devices`` is its ``CUDA_VISIBLE_DEVICES`` (None: unset, so
    every GPU NVML lists); ``where``, its ``placement`` as the trial recorded it (every node's, across
    nodes), read here when not given."""
    return {
        "parasweep": distribution_version(("parasweep",)),
        **git_state(SOURCE_ROOT),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": {name: distribution_version(dists) for name, dists in PACKAGES.items()},
        "engine": engine_name,
        "engine_version": engine_version(server_info),
        **gpu_state(visible_devices),
        **(where or placement(engine_name, visible_devices)),
        "os": _os_name(),
        "kernel": platform.release() or "unknown",
        "machine": platform.machine() or "unknown",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "hardware": hardware_name,
    }


def distribution_version(names: tuple[str, ...]) -> str:
    """The version of the first of ``names`` that is installed, from its metadata."""
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return NOT_INSTALLED


def git_state(repo_dir: Path) -> dict[str, Any]:
    """``{"git_commit": sha, "git_dirty": bool}`` for the checkout whose top level is ``repo_dir``;
    "unknown" for both outside git (an installed copy, or a folder inside someone else's checkout,
    such as a virtual environment inside a project: its commit is not this code's)."""
    unknown = {"git_commit": "unknown", "git_dirty": "unknown"}
    head = _git(repo_dir, "rev-parse", "--show-toplevel", "HEAD")
    if head is None or len(head.splitlines()) != 2:
        return unknown
    top, sha = head.splitlines()
    if Path(top).resolve() != repo_dir.resolve():
        return unknown
    # --no-optional-locks: status may refresh .git/index under index.lock, and trials side by side
    # would then collide and report "unknown"
    status = _git(repo_dir, "--no-optional-locks", "status", "--porcelain")
    # untracked files count: a new module next to the committed ones changes what runs
    return {"git_commit": sha, "git_dirty": "unknown" if status is None else bool(status.strip())}


def _git(repo_dir: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):  # no git, or it hung (a network file system)
        return None
    return out.stdout if out.returncode == 0 else None


def placement(engine_name: str, visible: str | None) -> dict[str, str]:
    """Where the trial runs, to trace a result to its hardware: ``host`` (this machine's name),
    ``ray_node_id`` (the Ray node of the worker, "none (...)" outside Ray: a single run, a prediction)
    and ``gpu_uuids`` (NVML's UUID of each of the trial's GPUs, comma-separated; "none (...)" where no
    physical GPU is used or NVML cannot tell)."""
    if engine_name.startswith("sim"):
        uuids = "none (the simulated engine uses no GPU)"
    else:
        found = gpu_uuids(visible)
        uuids = ",".join(found) if isinstance(found, list) else found
    return {"host": socket.gethostname() or "unknown", "ray_node_id": ray_node_id(), "gpu_uuids": uuids}


def joined_placement(places: list[dict[str, str]]) -> dict[str, str]:
    """Where a trial across nodes ran: each of ``placement``'s values for every node in rank order,
    comma-separated (a reason shared by every node, such as the simulated engine's, once)."""
    joined = {}
    for key in PLACEMENT_TAGS:
        values = [place[key] for place in places]
        same_reason = len(set(values)) == 1 and " " in values[0]
        joined[key] = values[0] if same_reason else ",".join(values)
    return joined


def ray_node_id() -> str:
    """The Ray node this process runs on, when Ray runs it (a sweep's trial in its worker)."""
    ray = sys.modules.get("ray")  # never imported here just to ask: a single run has no Ray
    if ray is None or not ray.is_initialized():
        return "none (not run by Ray)"
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception as exc:  # an answer about the record, not a reason to fail the trial
        return f"unknown ({type(exc).__name__})"


def gpu_uuids(visible: str | None) -> list[str] | str:
    """NVML's UUID of each GPU ``visible`` (``CUDA_VISIBLE_DEVICES``) names, or why there are none."""
    def read(nvml: Any, matches: list[Any]) -> list[str]:
        return [_text(nvml.nvmlDeviceGetUUID(m.handle)) if m.handle is not None else f"unknown ({m.label})"
                for m in matches]

    found = _read_nvml(visible, read)
    if isinstance(found, str):
        return f"none ({found})"
    return found or "none (CUDA_VISIBLE_DEVICES lists no GPU)"


def gpu_state(visible: str | None) -> dict[str, Any]:
    """``gpus`` (the model of each of the trial's GPUs), ``gpu_driver`` and ``cuda_driver`` from NVML;
    "none" for each where NVML cannot be used (``gpus`` then says why)."""
    def read(nvml: Any, matches: list[Any]) -> dict[str, Any]:
        gpus = [_text(nvml.nvmlDeviceGetName(m.handle)) if m.handle is not None else f"unknown ({m.label})"
                for m in matches]
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        return {"gpus": gpus or "none (CUDA_VISIBLE_DEVICES lists no GPU)",
                "gpu_driver": _text(nvml.nvmlSystemGetDriverVersion()),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}"}

    state = _read_nvml(visible, read)
    return _no_gpus(state) if isinstance(state, str) else state


def _read_nvml(visible: str | None, read: Callable[[Any, list[Any]], T]) -> T | str:
    """``read(nvml, the GPUs visible names)`` in one NVML session, or why NVML could not be read."""
    from orchestrator.telemetry.nvml_source import visible_devices

    try:
        import pynvml as nvml
    except ImportError:
        return "nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"NVML unavailable: {exc}"
    try:
        return read(nvml, visible_devices(nvml, visible))
    except nvml.NVMLError as exc:
        return f"NVML failed: {exc}"
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _no_gpus(why: str) -> dict[str, Any]:
    return {"gpus": f"none ({why})", "gpu_driver": "none", "cuda_driver": "none"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or platform.platform(terse=True)
    except OSError:  # not Linux, or no os-release file
        return platform.platform(terse=True)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
