"""The measured step-cost source: a stage's forward priced operator by operator from measured kernel tables.

A forward on one GPU of a stage is its layers' operators, in SGLang's order:

    attention (GQA)  qkv GEMM, attention kernel (prefill: context; decode: generation), o GEMM
    attention (MLA)  fused q_a/kv_a GEMM, q_b GEMM, [prefill: kv_b GEMM, context MLA kernel |
                     decode: absorbed BMM in, generation MLA kernel, absorbed BMM out], o GEMM
    dense MLP        gate_up GEMM, down GEMM
    MoE              router GEMM, shared-expert GEMMs, the fused routed-expert kernel
    elementwise      norms, residual adds, rotary, activation (no table: the roofline's memory term
                     and kernel floor)
    LM head          the vocabulary GEMM of the last stage (one row per sequence)
    collectives      two TP all-reduces per layer (attention out, MLP/MoE out), SGLang's own all-reduce as
                     measured replayed from a CUDA graph or launched eagerly

Every operator is looked up in the tables (``kernel_tables.py``); one whose dtype or shape is not
measured is priced by the roofline formula for that operator alone, and the source says so
(``coverage``; first out-of-range query of each operator in ``out_of_range``). Host dispatch, hops,
the scheduler and the pipeline's dynamics are not here: ``CostModel`` adds them whichever source prices
the kernels. docs/simulator.md ("Measured step costs") explains each mapping.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.costs import BF16_BYTES, BatchShape, CostModel, distinct_experts, ep_imbalance
from simulator.kernel_tables import GemmTable, KernelTables

# The routing the MoE tables are read at. "balanced" spreads a batch's k x tokens expert slots over as
# many distinct experts as possible (32 tokens x top-8 touch 256 of Kimi K2's 384 experts), more than
# uniform random routing touches (188) and more than a trained router does, whose load is skewed toward
# popular experts. The power-law rows (exponent 1.01) stand for that skew; AIConfigurator reads the same
# rows for DeepSeek-style models.
MOE_DISTRIBUTION = "power_law_1.01"
# Kernels of one layer the tables do not cover: input and post-attention norms (fused with the residual
# add), rotary embedding with the KV-cache store, the activation.
ELEMENTWISE_KERNELS_PER_LAYER = 4
ELEMENTWISE_KERNELS_PER_MOE_LAYER = 3  # top-k, token sort/align, combine
ELEMENTWISE_KERNELS_HEAD = 4  # final norm, logits gather, sampling, embedding of the next step
# SGLang runs a DeepSeek-style MoE layer's shared experts on a second CUDA stream, beside the routed
# experts, in a captured decode graph of at most this many tokens (DUAL_STREAM_TOKEN_THRESHOLD).
DUAL_STREAM_TOKENS = 1024


def gemm_dtype(bytes_per_param: float) -> str | None:
    """The tables' GEMM dtype for weights stored at this many bytes per parameter (None: no table)."""
    if bytes_per_param == 2.0:
        return "bfloat16"
    if 1.0 <= bytes_per_param < 1.01:  # FP8 with per-block scales
        return "fp8_block"
    return None


def moe_dtype(bytes_per_param: float) -> str | None:
    """The tables' fused-MoE dtype for routed experts stored at this many bytes per parameter."""
    if 0.5 < bytes_per_param < 0.6:  # 4-bit integers with group scales: SGLang runs them with Marlin
        return "int4_wo"
    return gemm_dtype(bytes_per_param)


@dataclass
class _Gemm:
    name: str
    n: int
    k: int
    weight_bytes: float  # per parameter
    table: GemmTable | None


@dataclass
class Coverage:
    """What priced each operator: "measured" or "roofline: why"."""

    priced: dict[str, str] = field(default_factory=dict)
    out_of_range: dict[str, str] = field(default_factory=dict)  # operator -> the first query outside

    def note(self, op: str, why: str) -> None:
        """The first query of ``op`` outside the measured range, and what priced it."""
        self.out_of_range.setdefault(op, why)

    def fallbacks(self) -> list[str]:
        lines = [f"{op}: {why.removeprefix('roofline: ')}" for op, why in self.priced.items()
                 if why.startswith("roofline")]
        return lines + [f"{op}: {why}" for op, why in self.out_of_range.items()]


class MeasuredCosts:
    """A :class:`simulator.costs.StepCostSource` reading measured kernel tables, for the model, layout,
    stages and constants of ``cost`` (whose roofline prices what the tables miss)."""

    def __init__(self, cost: CostModel, tables: KernelTables, attention_backend: str) -> None:
        self.roofline, self.tables = cost, tables
        self.spec, self.hw, self.par, self.p = cost.spec, cost.hw, cost.par, cost.p
        self.coverage = Coverage()
        self._bw = self.hw.mem_bw_gbs * 1e9
        self._peak = self.hw.peak_tflops_bf16 * 1e12
        self._floor = self.p.kernel_floor_us * 1e-6
        tp, s = self.par.tp, self.spec
        heads = s.num_heads // tp
        self._heads = heads

        attn_dtype = gemm_dtype(s.attn_bytes_per_param)
        aw, mw, sw = s.attn_bytes_per_param, s.dense_mlp_bytes_per_param, s.shared_expert_bytes_per_param
        gemm_tables: dict[str, GemmTable | None] = {}

        def gemm(name: str, n: int, k: int, wbytes: float) -> _Gemm:
            dtype = gemm_dtype(wbytes)
            if dtype is not None and dtype not in gemm_tables:
                gemm_tables[dtype] = tables.gemm(dtype)
            table = gemm_tables.get(dtype) if dtype else None
            op = _Gemm(name, n, k, wbytes, table)
            if dtype is None:
                self.coverage.priced[name] = f"roofline: {wbytes:g} bytes per weight has no GEMM table"
            elif table is None or table(1, n, k) is None:
                self.coverage.priced[name] = f"roofline: {dtype} GEMM {n}x{k} not measured"
            else:
                self.coverage.priced[name] = "measured"
            return op

        # -- attention block GEMMs
        if s.attention == "mla":
            rope, kv_lora = s.qk_rope_head_dim, s.kv_lora_rank
            nope = s.qk_head_dim - rope
            if s.q_lora_rank:
                attn_in = [gemm("attn.qkv_a", s.q_lora_rank + kv_lora + rope, s.hidden, aw),
                           gemm("attn.q_b", heads * s.qk_head_dim, s.q_lora_rank, aw)]
            else:
                attn_in = [gemm("attn.q", heads * s.qk_head_dim, s.hidden, aw),
                           gemm("attn.kv_a", kv_lora + rope, s.hidden, aw)]
            self._kv_b = gemm("attn.kv_b", heads * (nope + s.v_head_dim), kv_lora, aw)
        else:
            kv_heads = max(s.num_kv_heads // tp, 1)
            attn_in = [gemm("attn.qkv", (heads + 2 * kv_heads) * s.qk_head_dim, s.hidden, aw)]
            self._kv_b = None
        self._attn_gemms = [*attn_in, gemm("attn.o", s.hidden, heads * s.v_head_dim, aw)]
        self._attn_kernels = self._attention_tables(attn_dtype, attention_backend)

        # -- MLP / MoE GEMMs
        self._dense_gemms = [gemm("mlp.gate_up", 2 * s.dense_inter // tp, s.hidden, mw),
                             gemm("mlp.down", s.hidden, s.dense_inter // tp, mw)]
        self._moe_gemms: list[_Gemm] = []
        self._moe_curve = None
        if s.is_moe:
            self._moe_gemms.append(gemm("moe.router", s.num_experts, s.hidden, BF16_BYTES))
            if s.shared_inter:
                self._moe_gemms += [
                    gemm("moe.shared_gate_up", 2 * s.shared_inter // tp, s.hidden, sw),
                    gemm("moe.shared_down", s.hidden, s.shared_inter // tp, sw)]
            self._moe_curve = self._moe_table()
        self._head = gemm("lm_head", s.vocab // tp, s.hidden, s.lm_head_bytes_per_param)
        self._allreduce = {graph: self._allreduce_table(graph) for graph in (True, False)}

        # the shared experts overlap the routed ones (a second stream) in DeepSeek-style models
        self._dual_stream = s.attention == "mla" and bool(s.shared_inter)
        self._layer_cache: Callable[[int, int, bool, bool], tuple[float, float, float, float]] = (
            functools.lru_cache(maxsize=4096)(self._token_costs))
        # every stage prices the same shape in turn: one attention lookup per shape, not one per stage
        self._attention_cached: Callable[[BatchShape], float] = functools.lru_cache(maxsize=256)(
            self._attention_time)

    # -- construction helpers -------------------------------------------------------------------------------

    def _attention_tables(self, attn_dtype: str | None, backend: str) -> dict[str, object]:
        s, t = self.spec, self.tables
        # the tables' KV dtypes: BF16, or FP8 (--kv-cache-dtype fp8_*: one byte per element)
        kv_dtype = "fp8" if s.kv_bytes_per_elem == 1 else "bfloat16"
        found: dict[str, object] = {}
        if attn_dtype != "bfloat16":
            self.coverage.priced["attention"] = "roofline: attention tables are for BF16 models"
            return found
        if s.attention == "mla":
            found["context"] = t.mla("context", self._heads, kv_dtype)
            found["generation"] = t.mla("generation", self._heads, kv_dtype)
            found["bmm_pre"] = t.mla_bmm("mla_gen_pre", self._heads)
            found["bmm_post"] = t.mla_bmm("mla_gen_post", self._heads)
            what = f"MLA with {self._heads} heads per GPU"
        else:
            kv_heads = max(s.num_kv_heads // self.par.tp, 1)
            for phase in ("context", "generation"):
                found[phase] = t.attention(phase, self._heads, kv_heads, s.qk_head_dim, kv_dtype, backend)
            what = f"attention {self._heads} heads / {kv_heads} KV heads of {s.qk_head_dim} per GPU"
        for phase in ("context", "generation"):
            self.coverage.priced[f"attention.{phase}"] = ("measured" if found.get(phase) is not None
                                                          else f"roofline: {what} not measured")
        return found

    def _moe_table(self):  # type: ignore[no-untyped-def]
        s, par = self.spec, self.par
        dtype = moe_dtype(s.expert_bytes_per_param)
        moe_tp = par.tp // par.ep
        shape = f"{s.hidden}x{s.moe_inter} top-{s.top_k} of {s.num_experts}, moe_tp {moe_tp} ep {par.ep}"
        if dtype is None:
            self.coverage.priced["moe.experts"] = (f"roofline: {s.expert_bytes_per_param:g} bytes per expert "
                                                   "weight has no MoE table")
            return None
        curve = self.tables.moe(dtype, s.hidden, s.moe_inter, s.top_k, s.num_experts, moe_tp, par.ep,
                                MOE_DISTRIBUTION)
        self.coverage.priced["moe.experts"] = ("measured" if curve is not None
                                               else f"roofline: {dtype} MoE {shape} not measured")
        return curve

    def _allreduce_table(self, graph: bool):  # type: ignore[no-untyped-def]
        name = f"allreduce.{'graph' if graph else 'eager'}"
        if self.par.tp == 1:
            return None
        if self.par.ep > 1 and self.par.moe_a2a_backend != "none":
            self.coverage.priced["moe.all_to_all"] = "roofline: all-to-all MoE backends are not measured"
        curve = self.tables.allreduce(self.par.tp, graph)
        self.coverage.priced[name] = ("measured" if curve is not None
                                      else f"roofline: all-reduce over {self.par.tp} GPUs not measured")
        return curve

    # -- roofline prices of single operators (the fallback) ---------------------------------------------

    def _roofline(self, bytes_: float, flops: float, eta_mem: float | None = None) -> float:
        return max(bytes_ / ((eta_mem or self.p.eta_mem) * self._bw),
                   flops / (self.p.eta_compute * self._peak), self._floor)

    def _gemm_time(self, op: _Gemm, m: int) -> float:
        t = op.table(m, op.n, op.k) if op.table is not None else None
        if op.table is not None and m > op.table.largest_m:
            self.coverage.note(op.name, f"{m} rows above the largest measured ({op.table.largest_m:g}): "
                                        "in proportion")
        if t is None:
            if op.table is not None:
                self.coverage.note(op.name, f"{m} rows outside the measured range (roofline)")
            t = self._roofline(op.n * op.k * op.weight_bytes + (m * op.k + m * op.n) * BF16_BYTES,
                               2.0 * m * op.n * op.k)
        return t * self.p.scale_gemm

    def _moe_time(self, tokens: int) -> float:
        s, tp = self.spec, self.par.tp
        t = self._moe_curve(tokens) if self._moe_curve is not None else None
        if self._moe_curve is not None and tokens > self._moe_curve.largest:
            self.coverage.note("moe.experts", f"{tokens} tokens above the largest measured "
                                              f"({self._moe_curve.largest:g}): in proportion")
        if t is None:
            if self._moe_curve is not None:
                self.coverage.note("moe.experts", f"{tokens} tokens outside the measured range")
            touched = distinct_experts(s.num_experts, s.top_k, tokens)
            imb = ep_imbalance(s.num_experts, self.par.ep, touched)
            t = self._roofline(touched * s.expert_bytes * imb / tp,
                               2.0 * tokens * s.top_k * s.expert_params / tp, self.p.eta_expert)
        return t * self.p.scale_moe

    def _elementwise_time(self, tokens: int, kernels: int) -> float:
        # each reads and writes the hidden states of every token once or twice
        bytes_ = kernels * 2 * tokens * self.spec.hidden * BF16_BYTES
        return max(bytes_ / (self.p.eta_mem * self._bw), kernels * self._floor)

    def _attention_time(self, shape: BatchShape) -> float:
        """One layer's attention kernel(s) for ``shape``."""
        s = self.spec
        seqs = max(shape.seqs, 1)
        k = self._attn_kernels
        t: float | None
        if shape.decode:
            ctx = max(shape.kv_read_tokens / seqs, 1.0)
            t = _call(k.get("generation"), seqs, ctx)
            if t is not None and s.attention == "mla":
                pre, post = _call(k.get("bmm_pre"), seqs), _call(k.get("bmm_post"), seqs)
                t = None if pre is None or post is None else t + pre + post
        else:
            # the prompt length that gives this batch's attention work with no cached prefix
            isl = max(math.sqrt(2.0 * shape.attn_ctx / seqs), 1.0)
            t = _call(k.get("context"), seqs, isl)
        phase = "generation" if shape.decode else "context"
        if t is None:
            if k.get(phase) is not None:
                self.coverage.note(f"attention.{phase}",
                                   f"batch {seqs} outside the measured range (roofline)")
            # the roofline's per-layer KV read and attention FLOPs (every layer alike: stage 0's)
            st = self.roofline.stages[0]
            t = self._roofline(shape.kv_read_tokens * st.kv_bytes_per_token / st.layers,
                               shape.attn_ctx * st.attn_flops_per_ctx / st.layers)
        return t * self.p.scale_attention

    # -- the source's interface --------------------------------------------------------------------------

    def _token_costs(self, tokens: int, seqs: int, decode: bool, graph: bool
                     ) -> tuple[float, float, float, float]:
        """Per-layer seconds that depend only on the token count: (attention GEMMs + elementwise,
        dense MLP, MoE layer, LM head + head elementwise)."""
        attn = sum(self._gemm_time(g, tokens) for g in self._attn_gemms)
        if not decode and self._kv_b is not None:
            attn += self._gemm_time(self._kv_b, tokens)
        attn += self._elementwise_time(tokens, ELEMENTWISE_KERNELS_PER_LAYER)
        dense = sum(self._gemm_time(g, tokens) for g in self._dense_gemms)
        moe = 0.0
        if self.spec.is_moe:
            router, *shared = self._moe_gemms
            shared_t = sum(self._gemm_time(g, tokens) for g in shared)
            routed_t = self._moe_time(tokens)
            overlapped = self._dual_stream and graph and tokens <= DUAL_STREAM_TOKENS
            moe = (self._gemm_time(router, tokens)
                   + (max(shared_t, routed_t) if overlapped else shared_t + routed_t)
                   + self._elementwise_time(tokens, ELEMENTWISE_KERNELS_PER_MOE_LAYER))
        head = self._gemm_time(self._head, seqs) + self._elementwise_time(seqs, ELEMENTWISE_KERNELS_HEAD)
        return attn, dense, moe, head

    def family_times(self, stage: int, shape: BatchShape) -> dict[str, float]:
        """Seconds per operator family of one forward of ``shape`` on ``stage``: attention (projections,
        kernel, elementwise), dense MLP, MoE, LM head."""
        st = self.roofline.stages[stage]
        attn, dense, moe, head = self._layer_cache(shape.tokens, shape.seqs, shape.decode,
                                                   self.roofline.uses_cuda_graph(shape))
        return {"attention": st.layers * (attn + self._attention_cached(shape)),
                "dense_mlp": (st.layers - st.moe_layers) * dense, "moe": st.moe_layers * moe,
                "lm_head": head if st.last else 0.0}

    def gpu_time(self, stage: int, shape: BatchShape) -> float:
        return sum(self.family_times(stage, shape).values())

    def comm_time(self, stage: int, shape: BatchShape, graph: bool) -> float:
        if self.par.tp == 1:
            return 0.0
        st, cost = self.roofline.stages[stage], self.roofline
        elems = shape.tokens * self.spec.hidden
        curve = self._allreduce[graph]
        one = curve(elems) if curve is not None else None
        if one is None:
            if curve is not None:
                self.coverage.note("allreduce", f"{elems} elements outside the measured range")
            one = cost.allreduce_time(shape.tokens)
        t = 2 * st.layers * one
        if self.par.ep > 1 and self.par.moe_a2a_backend != "none":
            # the MoE layer's all-reduce becomes a dispatch and a combine (no table: the roofline's)
            t += st.moe_layers * (2 * cost.a2a_time(shape.tokens) - one)
        if st.last:  # vocab-parallel logits gathered before sampling: no table, the roofline's
            t += cost.logits_gather_time(shape.seqs)
        return t * self.p.scale_comm


def _call(fn: object, *args: float) -> float | None:
    return fn(*args) if fn is not None else None  # type: ignore[operator]
