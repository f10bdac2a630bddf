"""A stand-in for the ``pynvml`` module on machines without a GPU (this one, CI).

``FakeNvml(gpus).module()`` is a namespace with exactly the pynvml names ``NvmlReader`` uses
(:data:`NAMES`; a test checks each one exists in the real pynvml). It answers with pynvml's own
ctypes structures (``c_nvmlFieldValue_t``, ``c_nvmlUtilization_t``, ``c_nvmlMemory_t``) and raises
pynvml's own error classes (``NVMLError(code)`` maps to ``NVMLError_NotSupported`` and so on; they
need no driver), so the reader's decoding and error handling run exactly as against the library.

Each :class:`FakeGpu` is configurable between reads: power, counters and how much they grow per
field read, which calls or field ids it does not support, which calls fail with which error.
``calls`` counts every call by name and ``field_requests`` keeps each list of field ids asked for,
so tests can see what was (not) retried.
"""

from __future__ import annotations

import inspect
import re
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

# every pynvml name NvmlReader may use (functions, error classes, constants)
NAMES: tuple[str, ...] = (
    "NVMLError", "NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission",
    "NVMLError_LibRmVersionMismatch", "NVMLError_NotSupported", "NVMLError_FunctionNotFound",
    "NVML_SUCCESS", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NO_PERMISSION",
    "NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "NVML_CLOCK_SM", "NVML_TEMPERATURE_GPU",
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetComputeRunningProcesses", "NVMLLibraryMismatchError", "nvmlMemory_v2",
)
# The calls real pynvml wraps in throwOnVersionMismatch: where the driver lacks the versioned symbol
# (NVML_ERROR_FUNCTION_NOT_FOUND) they raise NVMLLibraryMismatchError, which is not an NVMLError.
# Read from the installed module's own source, so the stand-in follows the release in use.
VERSION_CHECKED = frozenset(re.findall(r"@throwOnVersionMismatch\s*\ndef (\w+)", inspect.getsource(pynvml)))

PCIE_MEMBER = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
               pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal"}
POWER, ENERGY = pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
PCIE_TX, PCIE_RX = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES


def nvml_error(code: int) -> pynvml.NVMLError:
    """pynvml's own exception for an NVML return code (``NVMLError_NotSupported`` for 3, ...)."""
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str
    power_w: float = 100.0
    power_limit_w: float = 700.0
    energy_mj: int = 5_000_000
    energy_step_mj: int = 0        # added to the energy counter at every field read
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    pcie_tx_step: int = 0          # added to the PCIe counters at every field read
    pcie_rx_step: int = 0
    # the PCIe counters' value type: 64-bit on current drivers; a 32-bit counter wraps at 2**32, as the
    # ctypes field the driver fills does
    pcie_value_type: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    util_gpu: int = 0
    util_mem: int = 0
    sm_clock_mhz: int = 1980
    mem_used: int = 1 << 30
    mem_total: int = 80 << 30
    mem_reserved: int = 0  # held by the driver: "used" to the v1 call, apart in v2
    temp_c: int = 40
    reasons: int = 0
    pids: list[int] = field(default_factory=list)  # compute processes on the GPU
    # pynvml function names that raise NVMLError_NotSupported, and field ids answered NOT_SUPPORTED
    unsupported: set[str | int] = field(default_factory=set)
    # pynvml function name -> the NVML return code it fails with (GPU_IS_LOST, say), until removed
    failing: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None,
                 mig: list[FakeGpu] | None = None) -> None:
        self.gpus, self.init_error = gpus, init_error
        self.shutdown_error: Exception | None = None
        # MIG instances: not among the indexed devices; NVML finds them by their MIG- UUID only
        self.mig = mig or []
        self.calls: Counter[str] = Counter()
        self.field_requests: list[list[int]] = []
        self.now_us = 0  # the field values' driver timestamp; 0: "none given" (the reader uses its clock)

    def module(self, omit: tuple[str, ...] = ()) -> types.SimpleNamespace:
        """The stand-in module; ``omit`` leaves names out (an older pynvml, say)."""
        ns: dict[str, Any] = {}
        for name in NAMES:
            if name in omit:
                continue
            ns[name] = getattr(self, name) if hasattr(self, name) else getattr(pynvml, name)
        return types.SimpleNamespace(**ns)

    def _enter(self, name: str, gpu: FakeGpu | None = None) -> None:
        self.calls[name] += 1
        if gpu is not None and name in gpu.unsupported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu is not None and name in gpu.failing:
            code = gpu.failing[name]
            if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and name in VERSION_CHECKED:
                raise pynvml.NVMLLibraryMismatchError(f"{name}: unversioned function called and the "
                                                      "pyNVML version does not match the NVML lib version")
            raise nvml_error(code)

    # -- library ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        if self.shutdown_error is not None:  # e.g. UNINITIALIZED after another user shut NVML down
            raise self.shutdown_error

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        # nvmlDeviceGetCount counts devices NVML may not be able to talk to: a GPU that fell off the
        # bus (GPU_IS_LOST) or one this process may not use (NO_PERMISSION) fails here, by index
        if not 0 <= index < len(self.gpus):
            self._enter("nvmlDeviceGetHandleByIndex")
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter("nvmlDeviceGetHandleByIndex", self.gpus[index])
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in [*self.gpus, *self.mig]:
            if gpu.uuid == uuid:
                self._enter("nvmlDeviceGetHandleByUUID", gpu)
                return gpu
        self._enter("nvmlDeviceGetHandleByUUID")
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    # -- per-device reads ---------------------------------------------------------------------------

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", gpu)
        return round(gpu.power_limit_w * 1000)

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, field_ids: list[int]) -> Any:
        self._enter("nvmlDeviceGetFieldValues", gpu)
        self.field_requests.append(list(field_ids))
        gpu.energy_mj += gpu.energy_step_mj
        gpu.pcie_tx_bytes += gpu.pcie_tx_step
        gpu.pcie_rx_bytes += gpu.pcie_rx_step
        known = {  # field id -> (valueType, union member, value), as the driver reports them
            POWER: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", round(gpu.power_w * 1000)),
            ENERGY: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", gpu.energy_mj),
            PCIE_TX: (gpu.pcie_value_type, PCIE_MEMBER[gpu.pcie_value_type], gpu.pcie_tx_bytes),
            PCIE_RX: (gpu.pcie_value_type, PCIE_MEMBER[gpu.pcie_value_type], gpu.pcie_rx_bytes),
        }
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for v, fid in zip(values, field_ids, strict=True):
            v.fieldId, v.timestamp = fid, self.now_us
            if fid in gpu.unsupported:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif fid not in known:
                v.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            else:
                v.valueType, member, value = known[fid]
                setattr(v.value, member, value)
                v.nvmlReturn = pynvml.NVML_SUCCESS
        return values

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetPowerUsage", gpu)
        return round(gpu.power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", gpu)
        return gpu.energy_mj

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", gpu)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", gpu)
        if clock != pynvml.NVML_CLOCK_SM:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.sm_clock_mhz

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> Any:
        # as pynvml: no version calls the v1 symbol, a version the _v2 one (which a driver may lack)
        self._enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", gpu)
        free = gpu.mem_total - gpu.mem_used - gpu.mem_reserved
        if version:
            return pynvml.c_nvmlMemory_v2_t(version=version, total=gpu.mem_total, reserved=gpu.mem_reserved,
                                            free=free, used=gpu.mem_used)
        return pynvml.c_nvmlMemory_t(total=gpu.mem_total, free=free, used=gpu.mem_used + gpu.mem_reserved)

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", gpu)
        return gpu.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", gpu)
        return gpu.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", gpu)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in gpu.pids]

    def nvmlDeviceGetTemperatureV(self, gpu: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperatureV", gpu)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", gpu)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c
