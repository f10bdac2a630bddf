"""The trial's physical GPUs, read with NVML (nvidia-ml-py, imported as ``pynvml``): a GPU source for
:class:`orchestrator.telemetry.gpu_sampler.GpuSampler`.

Which GPUs. NVML numbers devices in PCI-bus order and ignores ``CUDA_VISIBLE_DEVICES``, so each entry
of the trial's mask (as Ray set it) is mapped to an NVML handle by :func:`visible_devices` (the one
mapping; ``orchestrator.gpu_release`` uses it too):

* ``GPU-…`` / ``MIG-…``: by UUID, exact or a unique prefix of one (CUDA accepts a prefix too). A prefix
  is matched against the indexed GPUs' UUIDs; a MIG instance is not among those, so its UUID must be
  exact (``nvmlDeviceGetHandleByUUID`` finds it).
* an integer: the NVML index. That is how Ray and nvidia-smi number GPUs, and it is CUDA's number
  only where CUDA enumerates in PCI-bus order too (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or a node of
  identical GPUs, where CUDA's "fastest first" order falls back to bus order).
* unset or empty: the first ``count`` NVML devices.

The first ``count`` entries are the engine's GPUs 0..count-1; a row's ``gpu`` is that position.

What one read costs, per GPU: one batched ``nvmlDeviceGetFieldValues`` (instantaneous power, the
cumulative PCIe byte counters and, when asked, the total-energy counter) and five plain calls
(utilisation, SM clock, memory, clocks-event reasons, temperature). A metric the GPU does not support is
NaN and is not asked for again (a MIG instance, for one, reports neither power nor utilisation).

The energy counter is the one costly field: on an H200 (driver 580) reading it takes about 3.8 ms of
CPU, against about 1 µs for instant power, so it is read only when the sampler asks (``read(energy=
True)``: at the edges of every load point and at a low rate within one, docs/telemetry.md). Energy
always comes from that counter, never from integrating power samples alone: at 10 Hz those miss every
spike between two samples, the counter does not. Between two counter readings the analysis spreads
the counter's increase over time by the power samples (``analysis.telemetry.counter_increase``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vocab.telemetry import NOT_THROTTLING_BITS, GpuSource

NAN = math.nan

# Field ids, from pynvml where it names them; the numbers are NVML's (stable across versions).
_FIELDS = {"power": ("NVML_FI_DEV_POWER_INSTANT", 186),
           "energy": ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 83),
           "pcie_tx": ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197),
           "pcie_rx": ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)}

# A field whose nvmlReturn says one of these will not start working during the trial: stop asking.
# (Older drivers answer an unknown field id with INVALID_ARGUMENT.) Any other code is NaN this time.
_FIELD_GIVE_UP = (("NVML_ERROR_NOT_SUPPORTED", 3), ("NVML_ERROR_INVALID_ARGUMENT", 2),
                  ("NVML_ERROR_NO_PERMISSION", 4))

# Plain calls failing with these are given up on for that GPU (the next candidate call, if any, is
# tried once). Any other NVMLError propagates: the sampler counts the failed read and tries again.
_CALL_GIVE_UP = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")

# nvmlFieldValue_t.valueType -> the member of its value union
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# the width of each unsigned value type: a cumulative counter of that type wraps at 2**bits
_UNSIGNED_BITS = {1: 32, 2: 64, 3: 64, 6: 16}

# Why nvmlInit failed, in words a person can act on (first match wins).
_INIT_REASONS = (
    ("NVMLError_LibraryNotFound", "NVML library not found (no NVIDIA driver on this node)"),
    ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded on this node"),
    ("NVMLError_NoPermission", "no permission to use NVML on this node"),
    ("NVMLError_LibRmVersionMismatch", "NVML library and NVIDIA kernel driver versions differ "
                                       "(reboot or reload the driver)"),
)


class NvmlUnavailable(Exception):
    """NVML cannot be used for this trial's GPUs; the message is one line saying why."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Reading:
    """One field value: the value, when it was taken and on which clock (the driver's timestamp, or
    the host's monotonic clock where the driver gave none), and the width of its type (0: signed or
    floating, does not wrap)."""

    value: float
    when: float
    clock: str  # "driver" | "host"
    bits: int = 0


@dataclass
class _Gpu:
    """One of the trial's GPUs and what is known about reading it."""

    gpu: int
    handle: Any
    uuid: str
    power_limit_w: float
    field_ids: dict[str, int]                      # metric -> NVML field id, still asked for
    calls: dict[str, list[Callable[[Any], Any]]]   # metric -> candidate calls, still usable
    pcie_prev: dict[str, Reading] = field(default_factory=dict)  # counter -> its previous reading


class NvmlReader:
    """A GPU source over NVML. Build with :meth:`open`; ``read()`` returns one row per GPU."""

    name = GpuSource.NVML

    def __init__(self, nvml: Any, gpus: list[_Gpu]) -> None:
        self._nvml, self._gpus = nvml, gpus
        self._give_up_codes = {getattr(nvml, n, v) for n, v in _FIELD_GIVE_UP}
        self._give_up_errors = _give_up_errors(nvml)
        self._success = getattr(nvml, "NVML_SUCCESS", 0)
        self._open = True

    @property
    def uuids(self) -> list[str]:
        """The UUID of each of the trial's GPUs, in ``gpu`` order."""
        return [g.uuid for g in self._gpus]

    @classmethod
    def open(cls, visible: str | None, count: int, nvml: Any = None) -> NvmlReader:
        """NVML handles for the engine's ``count`` GPUs, given the trial's ``CUDA_VISIBLE_DEVICES``.

        Raises :class:`NvmlUnavailable` (one line) where NVML or one of those GPUs cannot be used.
        ``nvml`` is the ``pynvml`` module (the default) or a stand-in with the same names."""
        if count < 1:
            raise ValueError(f"count must be the number of GPUs the engine uses (>= 1), got {count}")
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                raise NvmlUnavailable("nvidia-ml-py (module pynvml) is not installed") from exc
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(_init_reason(nvml, exc)) from exc
        try:
            handles = _handles(nvml, visible, count)
            return cls(nvml, [_describe(nvml, i, h) for i, h in enumerate(handles)])
        except nvml.NVMLError as exc:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML failed while opening the GPUs: {exc}") from exc
        except NvmlUnavailable:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            raise

    def read(self, energy: bool = True) -> list[dict[str, Any]]:
        """One row per GPU; ``energy``: read the (costly) energy counter too, else its column is NaN."""
        return [self._read_gpu(g, energy) for g in self._gpus]

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # -- one GPU --------------------------------------------------------------------------------

    def _read_gpu(self, g: _Gpu, energy: bool) -> dict[str, Any]:
        fields = self._fields(g, energy)
        power_mw = fields["power"].value if "power" in fields else NAN
        if "power" not in g.field_ids and math.isnan(power_mw):
            power_mw = self._call(g, "power")  # the field is unsupported: nvmlDeviceGetPowerUsage
        energy_mj = fields["energy"].value if "energy" in fields else NAN
        if energy and "energy" not in g.field_ids and math.isnan(energy_mj):
            energy_mj = self._call(g, "energy")
        util = self._call(g, "util", raw=True)
        mem = self._call(g, "memory", raw=True)
        reasons = self._call(g, "throttle")
        return {
            "gpu": g.gpu,
            "uuid": g.uuid,
            "power_w": power_mw / 1000.0,
            "power_limit_w": g.power_limit_w,
            "util_gpu_pct": float(util.gpu) if util is not None else NAN,
            "util_mem_pct": float(util.memory) if util is not None else NAN,
            "sm_clock_mhz": self._call(g, "sm_clock"),
            "mem_used_bytes": float(mem.used) if mem is not None else NAN,
            "mem_total_bytes": float(mem.total) if mem is not None else NAN,
            "pcie_tx_bytes_s": _rate(g, "pcie_tx", fields.get("pcie_tx")),
            "pcie_rx_bytes_s": _rate(g, "pcie_rx", fields.get("pcie_rx")),
            "temp_c": self._call(g, "temp"),
            "throttle_reasons": reasons if math.isnan(reasons) else int(reasons) & ~NOT_THROTTLING_BITS,
            "energy_j": energy_mj / 1000.0,
        }

    def _fields(self, g: _Gpu, energy: bool) -> dict[str, Reading]:
        """metric -> reading, for every field this GPU answered this time (the energy counter only with
        ``energy``)."""
        metric_of = {fid: name for name, fid in g.field_ids.items() if energy or name != "energy"}
        if not metric_of:
            return {}
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(g.handle, list(metric_of))
        except self._give_up_errors:  # a driver without field values: the plain calls stand in
            g.field_ids.clear()
            return {}
        host_s = time.monotonic()
        out: dict[str, Reading] = {}
        for v in values:
            name = metric_of.get(int(v.fieldId))
            if name is None:
                continue
            if v.nvmlReturn == self._success:
                member = _VALUE_MEMBER.get(int(v.valueType))
                if member is not None:
                    # the driver's own timestamp (µs) when it gives one: PCIe rates are exact then
                    kind = int(v.valueType)
                    out[name] = Reading(float(getattr(v.value, member)),
                                        v.timestamp / 1e6 if v.timestamp else host_s,
                                        "driver" if v.timestamp else "host", _UNSIGNED_BITS.get(kind, 0))
            elif v.nvmlReturn in self._give_up_codes:
                del g.field_ids[name]
        return out

    def _call(self, g: _Gpu, metric: str, raw: bool = False) -> Any:
        """The first still-usable candidate call for ``metric`` (a float, or the raw struct with
        ``raw``); NaN (None with ``raw``) once every candidate has been given up on."""
        candidates = g.calls[metric]
        while candidates:
            try:
                value = candidates[0](g.handle)
            except self._give_up_errors:
                candidates.pop(0)
                continue
            return value if raw else float(value)
        return None if raw else NAN


def _rate(g: _Gpu, counter: str, now: Reading | None) -> float:
    """Bytes/s of a cumulative byte counter since this GPU's previous read. NaN the first time, after a
    missing value, when the two readings are on different clocks (a driver that gave a timestamp once
    and not the next time), or when the counter went back by more than a wrap explains (a reset). A
    counter that passed its type's maximum once since the last read wrapped: the bytes still count."""
    if now is None:
        g.pcie_prev.pop(counter, None)
        return NAN
    prev = g.pcie_prev.get(counter)
    g.pcie_prev[counter] = now
    if prev is None or prev.clock != now.clock or now.when <= prev.when:
        return NAN
    delta = now.value - prev.value
    if delta < 0:
        span = 2.0 ** now.bits if now.bits else 0.0
        if not span or -delta < span / 2:  # backwards by less than half the range: reset, not a wrap
            return NAN
        delta += span
    return delta / (now.when - prev.when)


def _init_reason(nvml: Any, exc: Exception) -> str:
    for cls_name, reason in _INIT_REASONS:
        cls = getattr(nvml, cls_name, None)
        if cls is not None and isinstance(exc, cls):
            return reason
    return f"NVML could not start: {exc}"


@dataclass(frozen=True)
class DeviceMatch:
    """One ``CUDA_VISIBLE_DEVICES`` entry mapped to NVML: ``handle`` is None when it matched nothing,
    and ``reason`` then says why in one line (naming the entry and what is valid)."""

    label: str        # how to name the GPU to a person: "GPU 2", "GPU 2 (GPU-8f3a)", a MIG UUID
    handle: Any | None
    reason: str = ""


def _by_index(nvml: Any, index: int) -> DeviceMatch:
    """GPU ``index``, or why NVML cannot open it: ``nvmlDeviceGetCount`` counts devices NVML may not
    talk to (a GPU fallen off the bus, one this process may not use), and only a trial that uses that
    GPU should lose its telemetry over it."""
    try:
        return DeviceMatch(f"GPU {index}", nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError as exc:
        return DeviceMatch(f"GPU {index}", None, f"GPU {index} cannot be opened through NVML ({exc})")


def _with_uuid(nvml: Any, index: int) -> tuple[DeviceMatch, str | None]:
    """GPU ``index`` and its UUID; no UUID where NVML cannot open or read it."""
    match = _by_index(nvml, index)
    if match.handle is None:
        return match, None
    try:
        return match, _text(nvml.nvmlDeviceGetUUID(match.handle))
    except nvml.NVMLError:
        return match, None


def visible_devices(nvml: Any, visible: str | None, limit: int | None = None) -> list[DeviceMatch]:
    """Each entry of ``visible`` (a ``CUDA_VISIBLE_DEVICES`` value), in order, mapped to an NVML handle;
    ``None`` (no mask) gives every device NVML lists (the first ``limit`` of them, where given). Blank
    entries are skipped, so a mask of only blanks gives ``[]``: whether that means "no GPU" or "unset"
    is the caller's policy. A device NVML cannot open is a match without a handle, with the reason:
    GPUs the caller does not use never make it fail. NVML must be initialised."""
    n = int(nvml.nvmlDeviceGetCount())
    if visible is None:
        return [_by_index(nvml, i) for i in range(n if limit is None else min(n, limit))]
    indexed: list[tuple[DeviceMatch, str | None]] | None = None  # opened once a UUID entry needs them
    out: list[DeviceMatch] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if limit is not None and len(out) >= limit:
            break
        if entry.isdigit():
            if int(entry) < n:
                out.append(_by_index(nvml, int(entry)))
            else:
                valid = f"valid: 0..{n - 1}" if n else "NVML sees no GPU"
                out.append(DeviceMatch(entry, None, f"CUDA_VISIBLE_DEVICES entry {entry!r} is past NVML's "
                                                    f"{n} GPU(s) ({valid}, or a GPU-/MIG- UUID)"))
            continue
        if not entry.startswith(("GPU-", "MIG-")):
            out.append(DeviceMatch(entry, None, f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither a GPU "
                                                "index nor a GPU-/MIG- UUID"))
            continue
        if indexed is None:  # a GPU NVML cannot open or read has no UUID here, and matches nothing
            indexed = [_with_uuid(nvml, i) for i in range(n)]
        uuids = [u for _, u in indexed]
        # a whole UUID is a prefix of itself (and of no other: NVML's UUIDs are all one length)
        hits = [i for i, u in enumerate(uuids) if u is not None and u.startswith(entry)]
        if len(hits) == 1:
            out.append(DeviceMatch(f"GPU {hits[0]} ({entry})", indexed[hits[0]][0].handle))
        elif hits:
            gpus = ", ".join(f"GPU {i}" for i in hits)
            out.append(DeviceMatch(entry, None, f"CUDA_VISIBLE_DEVICES entry {entry!r} is a prefix of "
                                                f"{len(hits)} GPUs' UUIDs ({gpus}); give enough of the "
                                                "UUID to name one"))
        else:
            try:  # MIG instances are not among the indexed devices, but NVML finds them by UUID
                out.append(DeviceMatch(entry, nvml.nvmlDeviceGetHandleByUUID(entry)))
            except nvml.NVMLError as exc:
                unreadable = [f"GPU {i}" for i, u in enumerate(uuids) if u is None]
                also = f"; NVML could not read {', '.join(unreadable)}" if unreadable else ""
                out.append(DeviceMatch(entry, None, f"CUDA_VISIBLE_DEVICES entry {entry!r} matches no GPU "
                                                    f"NVML knows ({exc}{also}; valid: a UUID as "
                                                    "`nvidia-smi -L` lists it or a unique prefix of one; "
                                                    "MIG UUIDs exact)"))
    return out


def _handles(nvml: Any, visible: str | None, count: int) -> list[Any]:
    """The handles of the engine's GPUs 0..count-1: the first ``count`` entries of the mask, and only
    those (a lost GPU elsewhere on the node is not the trial's concern)."""
    n = int(nvml.nvmlDeviceGetCount())
    if n == 0:
        raise NvmlUnavailable("NVML sees no GPU on this node")
    matches = visible_devices(nvml, visible, limit=count) if visible is not None else []
    if not matches:  # no mask (or only blanks): the engine's GPUs are the first ones NVML lists
        if n < count:
            raise NvmlUnavailable(f"NVML sees {n} GPU(s) but the engine uses {count}")
        matches = visible_devices(nvml, None, limit=count)
    elif len(matches) < count:
        raise NvmlUnavailable(f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(matches)} GPU(s) "
                              f"but the engine uses {count}")
    for m in matches[:count]:
        if m.handle is None:
            raise NvmlUnavailable(m.reason)
    return [m.handle for m in matches[:count]]


def _give_up_errors(nvml: Any) -> tuple[type[Exception], ...]:
    return tuple(c for c in (getattr(nvml, n, None) for n in _CALL_GIVE_UP) if c)


def _describe(nvml: Any, gpu: int, handle: Any) -> _Gpu:
    """Everything read once per GPU: UUID, enforced power limit, which fields and calls to use."""
    try:
        limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except _give_up_errors(nvml):
        limit_w = NAN
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)

    def usable(*functions: Any) -> list[Any]:
        """The candidate pynvml functions this pynvml has, newest name first (None: absent)."""
        return [f for f in functions if f is not None]

    memory = getattr(nvml, "nvmlDeviceGetMemoryInfo", None)
    v2 = getattr(nvml, "nvmlMemory_v2", None)
    memory_v2 = [lambda h: memory(h, version=v2)] if memory is not None and v2 is not None else []
    calls: dict[str, list[Callable[[Any], Any]]] = {
        "power": usable(getattr(nvml, "nvmlDeviceGetPowerUsage", None)),
        "energy": usable(getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)),
        "util": usable(getattr(nvml, "nvmlDeviceGetUtilizationRates", None)),
        # v2 keeps the driver's reserved memory apart from what processes use (v1 counts it as used);
        # a driver without the _v2 symbol answers FunctionNotFound and v1 stands in
        "memory": [*memory_v2, *usable(getattr(nvml, "nvmlDeviceGetMemoryInfo", None))],
        # the ThrottleReasons name is deprecated (to go with CUDA 14) but older pynvml has only it
        "throttle": usable(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None),
                           getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)),
        "sm_clock": [lambda h, f=f: f(h, sm) for f in usable(getattr(nvml, "nvmlDeviceGetClockInfo", None))],
        # TemperatureV is the current call; drivers older than it answer FunctionNotFound
        "temp": [lambda h, f=f: f(h, sensor)
                 for f in usable(getattr(nvml, "nvmlDeviceGetTemperatureV", None),
                                 getattr(nvml, "nvmlDeviceGetTemperature", None))],
    }
    field_ids = {metric: getattr(nvml, const, number) for metric, (const, number) in _FIELDS.items()}
    return _Gpu(gpu, handle, _text(nvml.nvmlDeviceGetUUID(handle)), limit_w, field_ids, calls)
