"""How many GPUs this node has, as NVML sees them (0 where there is no driver or no GPU)."""

from __future__ import annotations

import importlib.util


def local_gpu_count() -> int:
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # LibraryNotFound on machines without a driver: no GPUs, not an error
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
    finally:
        pynvml.nvmlShutdown()


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None
