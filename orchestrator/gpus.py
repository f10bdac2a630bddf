"""How many GPUs this node has, as NVML sees them (0 where there is no driver or no GPU)."""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any


def local_gpu_count(nvml: Any = None) -> int:
    """``nvml``: the ``pynvml`` module (the default) or a stand-in with the same names. Nothing NVML
    raises leaves here: config validation asks this, and a driver's hiccup is not a config error."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return 0
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:  # LibraryNotFound on machines without a driver: no GPUs, not an error
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError:
        return 0
    finally:
        with contextlib.suppress(nvml.NVMLError):  # an error on the way out must not hide the count
            nvml.nvmlShutdown()


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None
