"""Measured kernel latencies, read as data from the tables ``aiconfigurator-core`` ships.

NVIDIA's ``aiconfigurator-core`` (PyPI, Apache-2.0, Linux x86-64 wheels) carries Parquet tables of kernel
latencies measured with each engine's own kernels on real GPUs, under
``aiconfigurator_core/systems/data/<system>/<family>/<framework>/<version>/<table>.parquet`` (framework
``sglang`` or ``vllm``). This module only *reads* them: it finds the installed package's folder without
importing it (its estimator is not used), picks for each operator family the recorded version of the
engine nearest to the one launched (SGLang's table where the engine has none of that name: vLLM's MLA
tables are whole modules, not SGLang's kernel), keeps the implementation the engine runs
(``kernel_lanes.py``; a fused-MoE shape the nearest version did not measure is read from the table's other
versions, then SGLang's), and answers latency queries by interpolating between measured points:

- in token or batch counts and context lengths: linear in log(latency) against log(count), between the
  two measured neighbours (kernel time grows as a power of the work in each regime);
- in GEMM widths (``n``, ``k``): linear between the two measured neighbours (at a fixed token count a
  GEMM's time is close to proportional to its weight size);
- above the largest measured token count of a GEMM or fused MoE: in proportion to the token count.

Any other query outside the measured range returns ``None``. ``clamp`` gives the nearest measured point
instead, which the caller prices and scales by the roofline's growth beyond it (an attention table's
last context row or largest batch: the edge is continuous, and past it time grows as the work does).
Latencies are returned in seconds (the tables hold milliseconds). What each table's columns mean is
written down in docs/simulator.md ("Measured step costs").
"""

from __future__ import annotations

import bisect
import functools
import importlib.metadata
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from packaging.version import Version

from simulator import SGLANG_COMPAT_VERSION
from simulator.kernel_lanes import LANES, Lanes

PACKAGE = "aiconfigurator-core"
# SMs DeepEP's normal-mode kernels take unless told otherwise (deep_ep.Buffer.num_sms)
DEEPEP_NORMAL_SMS = 20


def systems_dir() -> Path | None:
    """The installed ``aiconfigurator_core/systems`` folder, or None when the package is not installed.
    ``find_spec`` locates a top-level package without running its ``__init__``."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "systems"
    return folder if (folder / "data").is_dir() else None


def package_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def table_sets() -> list[str]:
    """The systems (GPU table sets) the installed package has data for."""
    root = systems_dir()
    return sorted(p.name for p in (root / "data").iterdir() if p.is_dir()) if root else []


def nearest_version(available: Sequence[str], launched: str) -> str:
    """The newest recorded version not newer than ``launched``, else the oldest one: kernels change
    release by release, and a newer release is more likely to run the kernels of the one before it than of
    one after."""
    ordered = sorted(available, key=Version)
    older = [v for v in ordered if Version(v) <= Version(launched)]
    return older[-1] if older else ordered[0]


@dataclass(frozen=True)
class TableFile:
    family: str  # gemm, attention, mla, mla_bmm, moe, comm
    name: str  # e.g. gemm_perf
    framework: str  # the engine whose kernels were measured: sglang or vllm
    version: str  # the engine's version the table was measured with
    path: Path


@functools.cache
def find_table(system: str, family: str, name: str, launched: str, framework: str = "sglang"
               ) -> TableFile | None:
    """``<system>/<family>/<framework>/<version>/<name>.parquet`` for the version nearest to ``launched``
    among those that have this table; SGLang's, for the release the simulator follows, where ``framework``
    has none."""
    root = systems_dir()
    if root is None:
        return None
    base = root / "data" / system / family / framework
    versions = [d.name for d in base.iterdir() if (d / f"{name}.parquet").is_file()] if base.is_dir() else []
    if not versions:
        return None if framework == "sglang" else find_table(system, family, name, SGLANG_COMPAT_VERSION)
    version = nearest_version(versions, launched)
    return TableFile(family, name, framework, version, base / version / f"{name}.parquet")


def other_versions(f: TableFile) -> list[TableFile]:
    """The same table at the engine's other recorded versions, newest first."""
    base = f.path.parent.parent
    versions = sorted((d.name for d in base.iterdir() if d.name != f.version and (d / f.path.name).is_file()),
                      key=Version, reverse=True)
    return [TableFile(f.family, f.name, f.framework, v, base / v / f.path.name) for v in versions]


@functools.cache
def kernel_tables(system: str, launched: str, framework: str = "sglang", moe_backend: str = "auto"
                  ) -> KernelTables:
    """The one :class:`KernelTables` of this process for ``system``, the engine (``framework``) and its
    version ``launched``; ``moe_backend``: the MoE backend the engine was told to run (vLLM's
    ``--moe-backend``; auto: the nearest table's own implementation)."""
    return KernelTables(system, launched, LANES[framework], moe_backend)


@functools.cache
def _read(path: Path, filters: tuple[tuple[str, str, object], ...], columns: tuple[str, ...]
          ) -> list[dict[str, object]]:
    """Rows of one table matching ``filters``, as dicts; cached per process (predictions build many
    cost models from the same tables)."""
    # a column some systems' tables lack (A100's attention tables have no window_size: every row is
    # full attention) cannot filter them: such a filter is dropped
    present = set(pq.read_schema(path).names)
    kept = [f for f in filters if f[0] in present]
    table = pq.read_table(path, columns=list(columns), filters=kept or None)
    return table.to_pylist()


# -- interpolation ---------------------------------------------------------------------------------------

def _bracket(xs: Sequence[float], x: float) -> tuple[int, int] | None:
    """Indices of the measured neighbours of ``x`` in sorted ``xs`` (equal when ``x`` is measured); None
    outside the range."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return i, i
    return i - 1, i


def _loglog(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    if x0 == x1:
        return y0
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def _linear(x0: float, y0: float, x1: float, y1: float, x: float) -> float:
    if x0 == x1:
        return y0
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0)


class Curve:
    """Latency against one count (tokens, batch or context), interpolated log-log.

    ``proportional_above``: a token count above the largest measured one is priced in proportion to it
    (GEMMs and fused MoE are compute-bound there, their throughput saturated), not refused."""

    def __init__(self, points: dict[float, float], proportional_above: bool = False) -> None:
        self.xs = sorted(points)
        self.ys = [points[x] for x in self.xs]
        self.proportional_above = proportional_above

    @property
    def largest(self) -> float:
        return self.xs[-1]

    def clamp(self, x: float) -> float:
        """The nearest count inside the measured range."""
        return min(max(x, self.xs[0]), self.xs[-1])

    def __call__(self, x: float) -> float | None:
        if self.proportional_above and self.xs and x > self.xs[-1]:
            return self.ys[-1] * x / self.xs[-1]
        b = _bracket(self.xs, x)
        if b is None:
            return None
        i, j = b
        return _loglog(self.xs[i], self.ys[i], self.xs[j], self.ys[j], x)


class Surface:
    """Latency against two counts (batch and context length), interpolated log-log in each."""

    def __init__(self, points: dict[tuple[float, float], float]) -> None:
        rows: dict[float, dict[float, float]] = {}
        for (a, b), y in points.items():
            rows.setdefault(a, {})[b] = y
        self.xs = sorted(rows)
        self.curves = [Curve(rows[a]) for a in self.xs]

    def clamp(self, a: float, b: float) -> tuple[float, float]:
        """The nearest point inside the measured range: ``a`` within the rows, then ``b`` within what both
        rows around it measured (rows of large batches stop at shorter contexts)."""
        a = min(max(a, self.xs[0]), self.xs[-1])
        i, j = _bracket(self.xs, a)  # type: ignore[misc]
        lo = max(self.curves[i].xs[0], self.curves[j].xs[0])
        hi = min(self.curves[i].xs[-1], self.curves[j].xs[-1])
        return a, min(max(b, lo), hi)

    def __call__(self, a: float, b: float) -> float | None:
        br = _bracket(self.xs, a)
        if br is None:
            return None
        i, j = br
        yi, yj = self.curves[i](b), self.curves[j](b)
        if yi is None or yj is None:
            return None
        return _loglog(self.xs[i], yi, self.xs[j], yj, a)


class GemmTable:
    """``latency(m, n, k)`` of one GEMM dtype: log-log in the token count ``m``, linear in ``n`` and ``k``
    between the measured widths around them."""

    def __init__(self, rows: list[dict[str, object]]) -> None:
        by_nk: dict[tuple[int, int], dict[float, float]] = {}
        for r in rows:
            by_nk.setdefault((int(r["n"]), int(r["k"])), {})[float(r["m"])] = float(r["latency"]) * 1e-3
        self.curves = {nk: Curve(pts, proportional_above=True) for nk, pts in by_nk.items()}
        self.largest_m = min(c.largest for c in self.curves.values())
        self.ns = sorted({n for n, _ in by_nk})
        self.ks = sorted({k for _, k in by_nk})

    def __call__(self, m: float, n: float, k: float) -> float | None:
        bn, bk = _bracket(self.ns, n), _bracket(self.ks, k)
        if bn is None or bk is None:
            return None
        corners: dict[tuple[int, int], float] = {}
        for ni in {self.ns[bn[0]], self.ns[bn[1]]}:
            for ki in {self.ks[bk[0]], self.ks[bk[1]]}:
                curve = self.curves.get((ni, ki))
                y = curve(m) if curve else None
                if y is None:
                    return None
                corners[(ni, ki)] = y
        n0, n1 = self.ns[bn[0]], self.ns[bn[1]]
        k0, k1 = self.ks[bk[0]], self.ks[bk[1]]
        at_k0 = _linear(n0, corners[(n0, k0)], n1, corners[(n1, k0)], n)
        at_k1 = _linear(n0, corners[(n0, k1)], n1, corners[(n1, k1)], n)
        return _linear(k0, at_k0, k1, at_k1, k)


# -- the tables of one system, for one launched version -----------------------------------------------------

class KernelTables:
    """The measured tables of one GPU (``system``) for one engine (``lanes``: its tables and the kernels
    it runs) at its launched version. Each method returns an interpolator, or None with nothing measured
    for those keys. Get one with :func:`kernel_tables`: it is built once per process, and so is each
    interpolator (predictions build many cost models from the same tables)."""

    def __init__(self, system: str, launched: str, lanes: Lanes, moe_backend: str = "auto") -> None:
        self.system, self.launched, self.lanes, self.moe_backend = system, launched, lanes, moe_backend
        self._built: dict[tuple[object, ...], object] = {}

    def _once(self, build, *args: object):  # type: ignore[no-untyped-def]
        """``build(*args)``, built the first time it is asked for."""
        key = (build.__name__, *args)
        if key not in self._built:
            self._built[key] = build(*args)
        return self._built[key]

    def _file(self, family: str, name: str) -> TableFile | None:
        return find_table(self.system, family, name, self.launched, self.lanes.framework)

    def versions(self) -> dict[str, str]:
        """family/table -> the engine and version its numbers were measured with, "SGLang 0.5.14" (those
        present)."""
        out = {}
        for family, name in (("gemm", "gemm_perf"), ("attention", "context_attention_perf"),
                             ("attention", "generation_attention_perf"), ("mla", "context_mla_perf"),
                             ("mla", "generation_mla_perf"), ("mla_bmm", "mla_bmm_perf"),
                             ("moe", "moe_perf"), ("comm", "custom_allreduce_perf")):
            f = self._file(family, name)
            if f is not None:
                out[f"{family}/{name}"] = f"{LANES[f.framework].engine} {f.version}"
        return out

    def gemm(self, dtype: str) -> GemmTable | None:
        return self._once(self._build_gemm, dtype)

    def _build_gemm(self, dtype: str) -> GemmTable | None:
        f = self._file("gemm", "gemm_perf")
        rows = self._trusted_rows(f, (("gemm_dtype", "=", dtype),), ("m", "n", "k", "latency"),
                                  lambda lanes: lanes.gemm.get(dtype, ())) if f else []
        return GemmTable(rows) if rows else None

    def _trusted_rows(self, f: TableFile, keys: tuple[tuple[str, str, object], ...], columns: tuple[str, ...],
                      preferred: Callable[[Lanes], Sequence[str]], runs: Sequence[str] = ()
                      ) -> list[dict[str, object]]:
        """The rows of ``keys`` of the implementation the engine ``runs`` (the first of them measured),
        from the first recorded version of ``f``'s table that measured it (``f``'s, then the others newest
        first); without such rows, those of ``f`` of one implementation (the first of ``preferred`` by the
        lanes of the engine whose table it is); where ``f`` measured none but distrusted ones, the first
        that did of the engine's other recorded versions (newest first), then, for another engine,
        SGLang's (the version the simulator follows first)."""
        found = [f, *other_versions(f)]
        if f.framework != "sglang":
            sglang = find_table(self.system, f.family, f.name, SGLANG_COMPAT_VERSION)
            found += [sglang, *other_versions(sglang)] if sglang else []
        for table in found if runs else ():
            rows = [r for r in _read(table.path, keys, ("kernel_source", *columns))
                    if r["kernel_source"] in runs and r["kernel_source"] not in self._lanes(table).distrusted]
            if rows:
                return _one_source(rows, runs)
        for table in found:
            lanes = self._lanes(table)
            rows = [r for r in _read(table.path, keys, ("kernel_source", *columns))
                    if r["kernel_source"] not in lanes.distrusted]
            if rows:
                return _one_source(rows, preferred(lanes))
        return []

    def _lanes(self, f: TableFile) -> Lanes:
        """The kernel choices of the engine whose table ``f`` is (SGLang's where it stood in)."""
        return LANES[f.framework]

    def attention(self, phase: str, heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                  backend: str) -> Surface | None:
        """``phase``: "context" (batch, prompt length) or "generation" (batch, cached tokens)."""
        return self._once(self._build_attention, phase, heads, kv_heads, head_dim, kv_dtype, backend)

    def _build_attention(self, phase: str, heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                         backend: str) -> Surface | None:
        f = self._file("attention", f"{phase}_attention_perf")
        if f is None:
            return None
        keys = (("num_heads", "=", heads), ("num_key_value_heads", "=", kv_heads),
                ("head_dim", "=", head_dim), ("kv_cache_dtype", "=", kv_dtype),
                ("attn_dtype", "=", "bfloat16"), ("window_size", "=", 0))
        rows = _read(f.path, keys, ("kernel_source", "batch_size", "isl", "step", "latency"))
        rows = _one_source(rows, self._lanes(f).attention_sources(backend))
        along = "isl" if phase == "context" else "step"
        points = {(float(r["batch_size"]), float(r[along])): float(r["latency"]) * 1e-3 for r in rows}
        return Surface(points) if points else None

    def mla(self, phase: str, heads: int, kv_dtype: str) -> Surface | None:
        """MLA attention, ``heads`` query heads per GPU; "context" (batch, prompt) or "generation"
        (batch, cached tokens)."""
        return self._once(self._build_mla, phase, heads, kv_dtype)

    def _build_mla(self, phase: str, heads: int, kv_dtype: str) -> Surface | None:
        f = self._file("mla", f"{phase}_mla_perf")
        if f is None:
            return None
        keys = (("num_heads", "=", heads), ("kv_cache_dtype", "=", kv_dtype), ("mla_dtype", "=", "bfloat16"))
        rows = _read(f.path, keys, ("batch_size", "isl", "step", "latency"))
        along = "isl" if phase == "context" else "step"
        points = {(float(r["batch_size"]), float(r[along])): float(r["latency"]) * 1e-3 for r in rows}
        return Surface(points) if points else None

    def mla_bmm(self, op: str, heads: int) -> Curve | None:
        """The absorbed-MLA batched GEMMs of a decode step (``mla_gen_pre``, ``mla_gen_post``) against
        the token count."""
        return self._once(self._build_mla_bmm, op, heads)

    def _build_mla_bmm(self, op: str, heads: int) -> Curve | None:
        f = self._file("mla_bmm", "mla_bmm_perf")
        if f is None:
            return None
        keys = (("op_name", "=", op), ("num_heads", "=", heads), ("bmm_dtype", "=", "bfloat16"))
        rows = _read(f.path, keys, ("num_tokens", "latency"))
        points = {float(r["num_tokens"]): float(r["latency"]) * 1e-3 for r in rows}
        return Curve(points) if points else None

    def moe(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, moe_tp: int, moe_ep: int,
            distribution: str) -> Curve | None:
        """One fused-MoE layer on one GPU (routed experts only) against the batch's token count."""
        return self._once(self._build_moe, dtype, hidden, inter, topk, experts, moe_tp, moe_ep, distribution)

    def _build_moe(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, moe_tp: int,
                   moe_ep: int, distribution: str) -> Curve | None:
        f = self._file("moe", "moe_perf")
        if f is None:
            return None
        keys = (("moe_dtype", "=", dtype), ("hidden_size", "=", hidden), ("inter_size", "=", inter),
                ("topk", "=", topk), ("num_experts", "=", experts), ("moe_tp_size", "=", moe_tp),
                ("moe_ep_size", "=", moe_ep), ("distribution", "=", distribution))
        rule = self.lanes.moe_runs
        runs = rule(dtype, self.moe_backend) if rule else ()
        rows = self._trusted_rows(f, keys, ("num_tokens", "latency"), lambda lanes: lanes.moe, runs)
        points = {float(r["num_tokens"]): float(r["latency"]) * 1e-3 for r in rows}
        return Curve(points, proportional_above=True) if points else None

    def deepep(self, mode: str, hidden: int, topk: int, experts: int) -> Curve | None:
        """DeepEP's dispatch plus combine on one node, ``mode`` "normal" (prefill batches) or
        "low_latency" (decode), against the tokens each rank sends. Normal mode at the SM count DeepEP
        gives its kernels by default (``DEEPEP_NORMAL_SMS``), the nearest measured one otherwise."""
        return self._once(self._build_deepep, mode, hidden, topk, experts)

    def _build_deepep(self, mode: str, hidden: int, topk: int, experts: int) -> Curve | None:
        low = mode == "low_latency"
        f = self._file("comm", "wideep_deepep_ll_perf" if low else "wideep_deepep_normal_perf")
        if f is None:
            return None
        keys = (("hidden_size", "=", hidden), ("num_topk", "=", topk), ("num_experts", "=", experts),
                ("node_num", "=", 1))
        if low:
            rows = _read(f.path, keys, ("num_token", "dispatch_avg_t_us", "combine_avg_t_us"))
            points = {float(r["num_token"]): (float(r["dispatch_avg_t_us"]) + float(r["combine_avg_t_us"]))
                      * 1e-6 for r in rows}
        else:
            rows = _read(f.path, keys, ("num_token", "dispatch_sms", "dispatch_transmit_us", "combine_sms",
                                        "combine_transmit_us"))
            sms = sorted({int(r["dispatch_sms"]) for r in rows}, key=lambda n: abs(n - DEEPEP_NORMAL_SMS))
            kept = [r for r in rows if sms and r["dispatch_sms"] == sms[0] and r["combine_sms"] == sms[0]]
            points = {float(r["num_token"]): (float(r["dispatch_transmit_us"])
                                              + float(r["combine_transmit_us"])) * 1e-6 for r in kept}
        return Curve(points, proportional_above=True) if points else None

    def allreduce(self, gpus: int, graph: bool) -> Curve | None:
        """The engine's tensor-parallel all-reduce (SGLang's and vLLM's
        ``tensor_model_parallel_all_reduce``: the custom all-reduce where it applies, else NCCL) against the
        message size in bf16 elements, replayed from a CUDA graph or eager."""
        return self._once(self._build_allreduce, gpus, graph)

    def _build_allreduce(self, gpus: int, graph: bool) -> Curve | None:
        points = self.allreduce_points(gpus, graph)
        if not points:
            return None
        other = self.allreduce_points(gpus, not graph)
        kept = {x: y for x, y in points.items() if x not in uncorroborated_spikes(points, other)}
        return Curve(kept)

    def fused_allreduce(self, gpus: int) -> Curve | None:
        """FlashInfer's all-reduce fused with an RMSNorm (vLLM's ``fuse_allreduce_rms``), against the
        message size in bf16 elements: FlashInfer's ``trtllm_allreduce_fusion`` is TensorRT-LLM's
        all-reduce fusion kernel, ported, which aiconfigurator-core times in its TensorRT-LLM tables (the
        newest recorded version); the same inside a CUDA graph or not (a compiled pass)."""
        return self._once(self._build_fused_allreduce, gpus)

    def _build_fused_allreduce(self, gpus: int) -> Curve | None:
        f = find_table(self.system, "comm", "custom_allreduce_perf", "99", "trtllm")
        if f is None or f.framework != "trtllm":
            return None
        rows = _read(f.path, (("num_gpus", "=", gpus), ("allreduce_dtype", "=", "bfloat16")),
                     ("message_size", "latency"))
        points = {float(r["message_size"]): float(r["latency"]) * 1e-3 for r in rows}
        return Curve(points) if points else None

    def allreduce_points(self, gpus: int, graph: bool) -> dict[float, float]:
        """The measured all-reduce rows as they are: message size in bf16 elements -> seconds."""
        f = self._file("comm", "custom_allreduce_perf")
        if f is None:
            return {}
        keys = (("num_gpus", "=", gpus), ("backend", "=", self._lanes(f).allreduce_backend(graph)),
                ("allreduce_dtype", "=", "bfloat16"))
        rows = _read(f.path, keys, ("message_size", "latency"))
        return {float(r["message_size"]): float(r["latency"]) * 1e-3 for r in rows}


# A point counts as a spike when it is this much slower than the slower of its neighbours: well past the
# few per cent the flat, latency-bound part of these tables wanders from size to size.
SPIKE_RATIO = 1.2


def uncorroborated_spikes(points: dict[float, float], other: dict[float, float]) -> set[float]:
    """Sizes where ``points`` is ``SPIKE_RATIO`` slower than both neighbours while ``other`` (the same
    all-reduce measured the other way: replayed from a CUDA graph against launched eagerly) is not: a
    one-sample hiccup, since a larger message never completes sooner under the same algorithm and
    protocol. A step the two measurements share is the collective library switching protocol (on the
    PCIe box NCCL keeps its low-latency protocol up to 512 KB and changes to Simple above it), so it is
    real and kept (docs/simulator.md, "The all-reduce table")."""
    def spike(table: dict[float, float], a: float, x: float, b: float) -> bool:
        return all(k in table for k in (a, x, b)) and table[x] > SPIKE_RATIO * max(table[a], table[b])

    xs = sorted(points)
    return {x for a, x, b in zip(xs, xs[1:], xs[2:], strict=False)
            if spike(points, a, x, b) and not spike(other, a, x, b)}


def _one_source(rows: list[dict[str, object]], preferred: Sequence[str]) -> list[dict[str, object]]:
    """Rows of one kernel implementation: the first of ``preferred`` measured, else the first in name
    order (a table may hold several implementations of one operator; mixing them would interpolate across
    kernels)."""
    sources = sorted({str(r["kernel_source"]) for r in rows})
    if not sources:
        return rows
    chosen = next((p for p in preferred if p in sources), sources[0])
    return [r for r in rows if r["kernel_source"] == chosen]
