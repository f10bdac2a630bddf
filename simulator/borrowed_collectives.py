"""A tensor-parallel all-reduce measured on another system, pricing a box that has no kernel tables of its
own (``HardwareConf.collective_tables``).

The roofline prices a GPU nobody timed kernel by kernel; its all-reduce formula (ring, alpha-beta at the
profile's link bandwidth) is a guess at what the bus gives. Where a measured system shares the box's GPU
generation and bus, its all-reduce table says more: on eight Ada GPUs over PCIe Gen4 (aiconfigurator-core's
L40S server) vLLM's and SGLang's all-reduce of 2 MB takes 0.12 ms between two GPUs (their custom
all-reduce, peer to peer) and 0.84 ms among four (NCCL: neither engine runs its custom all-reduce on more
than two PCIe GPUs), a step no single link bandwidth reproduces. docs/simulator.md, "A box priced by the
roofline with a measured all-reduce".

The table is the engine's own (``kernel_tables.KernelTables.allreduce``: vLLM's or SGLang's, at the
recorded version nearest the one played), read at the TP group's size, in the CUDA-graph or the eager lane
as the step runs. A message below the smallest measured takes its time (the flat, latency-bound end); one
above the largest is priced in proportion (bandwidth-bound there).
"""

from __future__ import annotations

from simulator.kernel_tables import Curve, kernel_tables, package_version


def measured_by(system: str, launched: str, framework: str) -> str:
    """What measured ``system``'s all-reduce as the engine ``framework`` at ``launched`` reads it:
    "aiconfigurator-core 0.12.0: l40s, vLLM 0.22.0"."""
    versions = kernel_tables(system, launched, framework).versions()
    measured_with = versions.get("comm/custom_allreduce_perf", "")
    return f"aiconfigurator-core {package_version()}: {system}, {measured_with}".rstrip(", ")


class MeasuredAllreduce:
    """``system``'s measured all-reduce over ``tp`` GPUs, as the engine ``framework`` at ``launched`` runs
    it (``costs.BorrowedAllreduce``)."""

    def __init__(self, system: str, launched: str, framework: str, tp: int) -> None:
        tables = kernel_tables(system, launched, framework)
        self._curves: dict[bool, Curve | None] = {g: tables.allreduce(tp, g) for g in (False, True)}

    @property
    def measured(self) -> bool:
        """The table has this TP size in both lanes."""
        return all(c is not None and c.xs for c in self._curves.values())

    def allreduce(self, elems: float, graph: bool) -> float | None:
        curve = self._curves[graph]
        if curve is None or not curve.xs:
            return None
        if elems > curve.largest:
            top = curve(curve.largest)
            return None if top is None else top * elems / curve.largest
        return curve(max(elems, curve.xs[0]))
