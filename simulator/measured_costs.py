"""The measured step-cost source: a stage's forward priced operator by operator from measured kernel tables.

A forward on one GPU of a stage is its layers' operators, in SGLang's order:

    attention (GQA)  qkv GEMM, attention kernel (prefill: context; decode: generation), o GEMM
    attention (MLA)  fused q_a/kv_a GEMM, q_b GEMM, [prefill: kv_b GEMM, context MLA kernel |
                     decode: absorbed BMM in, generation MLA kernel, absorbed BMM out], o GEMM
    dense MLP        gate_up GEMM, down GEMM
    MoE              router GEMM, shared-expert GEMMs, the fused routed-expert kernel
    elementwise      norms with their residual adds, rotary with the KV-cache store, the dense MLP's
                     activation (no table: the roofline's memory term over the bytes each kernel moves
                     for this model's shapes, and the kernel floor)
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

from simulator.costs import (
    BF16_BYTES,
    QK_NORM_KERNELS,
    BatchShape,
    CostModel,
    distinct_experts,
    ep_imbalance,
)
from simulator.kernel_tables import GemmTable, KernelTables
from simulator.model_spec import is_fp8

# The routing the MoE tables are read at. "balanced" spreads a batch's k x tokens expert slots over as
# many distinct experts as possible (32 tokens x top-8 touch 256 of Kimi K2's 384 experts), more than
# uniform random routing touches (188) and more than a trained router does, whose load is skewed toward
# popular experts. The power-law rows (exponent 1.01) stand for that skew; AIConfigurator reads the same
# rows for DeepSeek-style models.
MOE_DISTRIBUTION = "power_law_1.01"
# Kernels of one layer the tables do not cover: input and post-attention norms (fused with the residual
# add), rotary embedding with the KV-cache store; a dense layer's activation (silu_and_mul) besides.
ELEMENTWISE_KERNELS_PER_LAYER = 3
ELEMENTWISE_KERNELS_DENSE_MLP = 1
ELEMENTWISE_KERNELS_PER_MOE_LAYER = 3  # top-k, token sort/align, combine
ELEMENTWISE_KERNELS_HEAD = 4  # final norm, logits gather, sampling, embedding of the next step
# SGLang runs a DeepSeek-style MoE layer's shared experts on a second CUDA stream, beside the routed
# experts, in a captured decode graph of at most this many tokens (DUAL_STREAM_TOKEN_THRESHOLD).
DUAL_STREAM_TOKENS = 1024


def is_four_bit(bytes_per_param: float) -> bool:
    """Weights of 4 bits with group scales (4-bit integers, or NVFP4 where the model says so)."""
    return 0.5 < bytes_per_param < 0.6


def gemm_dtype(bytes_per_param: float, nvfp4: bool = False) -> str | None:
    """The tables' GEMM dtype for weights stored at this many bytes per parameter (None: no table);
    ``nvfp4``: the model's 4-bit weights are NVFP4 (``ModelSpec.nvfp4``)."""
    if nvfp4 and is_four_bit(bytes_per_param):
        return "nvfp4"
    if bytes_per_param == 2.0:
        return "bfloat16"
    if is_fp8(bytes_per_param):  # FP8 with per-block scales
        return "fp8_block"
    return None


def moe_dtype(bytes_per_param: float, nvfp4: bool = False) -> str | None:
    """The tables' fused-MoE dtype for routed experts stored at this many bytes per parameter."""
    # 4-bit integers with group scales (not NVFP4): SGLang runs them with Marlin
    if is_four_bit(bytes_per_param) and not nvfp4:
        return "int4_wo"
    return gemm_dtype(bytes_per_param, nvfp4)


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

    def __init__(self, cost: CostModel, tables: KernelTables, attention_backend: str,
                 fuse_shared_experts: bool = True) -> None:
        self.roofline, self.tables = cost, tables
        self.spec, self.hw, self.par, self.p = cost.spec, cost.hw, cost.par, cost.p
        self.coverage = Coverage()
        self._bw = self.hw.mem_bw_gbs * 1e9
        self._peak = self.hw.peak_tflops_bf16 * 1e12
        self._peak_fp8 = (self.hw.peak_tflops_fp8 or self.hw.peak_tflops_bf16) * 1e12
        self._floor = self.p.kernel_floor_us * 1e-6
        tp, s = self.par.tp, self.spec
        heads = s.num_heads // tp
        self._heads = heads

        aw, mw, sw = s.attn_bytes_per_param, s.dense_mlp_bytes_per_param, s.shared_expert_bytes_per_param
        gemm_tables: dict[str, GemmTable | None] = {}

        def gemm(name: str, n: int, k: int, wbytes: float) -> _Gemm:
            dtype = gemm_dtype(wbytes, s.nvfp4)
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
        self._attn_kernels = self._attention_tables(attention_backend)

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
        self._fused = self._fused_allreduce_table()

        self._attn_elementwise = self._attention_elementwise_elems()
        self._qk_width = (heads + max(s.num_kv_heads // tp, 1)) * s.qk_head_dim  # q and k, one GPU's heads
        # SGLang folds DeepSeek-V3's shared expert into the routed experts' kernel as one more expert every
        # token picks (determine_num_fused_shared_experts: DeepseekV3ForCausalLM with its 256 routed
        # experts, unless a DeepEP backend or --disable-shared-experts-fusion); other DeepSeek-style
        # models (Kimi K2's 384 experts) run their shared experts on a second stream beside the routed ones
        self._fused_shared = (fuse_shared_experts and s.architecture == "DeepseekV3ForCausalLM"
                              and s.num_experts == 256 and bool(s.shared_inter)
                              and self.par.moe_a2a_backend == "none")
        self._dual_stream = s.attention == "mla" and bool(s.shared_inter) and not self._fused_shared
        self._layer_cache: Callable[[int, int, bool, bool], tuple[float, float, float, float]] = (
            functools.lru_cache(maxsize=4096)(self._token_costs))
        # every stage prices the same shape in turn: one attention lookup per shape, not one per stage
        self._attention_cached: Callable[[BatchShape], float] = functools.lru_cache(maxsize=256)(
            self._attention_time)

    # -- construction helpers -------------------------------------------------------------------------------

    def _attention_tables(self, backend: str) -> dict[str, object]:
        s, t = self.spec, self.tables
        # the tables' KV dtypes: BF16, or FP8 (--kv-cache-dtype fp8_*: one byte per element)
        kv_dtype = "fp8" if s.kv_bytes_per_elem == 1 else "bfloat16"
        found: dict[str, object] = {}
        # The attention kernel runs on BF16 activations against the KV cache whatever the weights are
        # stored in (FP8 weights are dequantized inside the GEMMs): its tables are keyed by the KV dtype.
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
        dtype = moe_dtype(s.expert_bytes_per_param, s.nvfp4)
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

    def _fused_allreduce_table(self):  # type: ignore[no-untyped-def]
        """vLLM's FlashInfer all-reduce where its compilation fuses the TP all-reduces (None else)."""
        limit = self.roofline.fused_allreduce_bytes
        if not limit or self.par.tp == 1:
            return None
        curve = self.tables.fused_allreduce(self.par.tp)
        self.coverage.priced["allreduce.fused"] = (
            f"measured: FlashInfer's fused all-reduce up to {limit / 2**20:g} MiB (TensorRT-LLM's kernel)"
            if curve is not None else f"not measured over {self.par.tp} GPUs: the custom all-reduce's")
        return curve

    def _fuses(self, tokens: int) -> bool:
        """The all-reduce of ``tokens`` hidden states is vLLM's fused one (its size within the limit)."""
        return self._fused is not None and tokens * self.spec.hidden * BF16_BYTES <= \
            self.roofline.fused_allreduce_bytes

    # -- roofline prices of single operators (the fallback) ---------------------------------------------

    def _roofline(self, bytes_: float, flops: float, eta_mem: float | None = None,
                  fp8: bool = False) -> float:
        """One operator by the roofline; ``fp8``: a GEMM of FP8 weights, at the FP8 tensor peak."""
        return max(bytes_ / ((eta_mem or self.p.eta_mem) * self._bw),
                   flops / (self.p.eta_compute * (self._peak_fp8 if fp8 else self._peak)), self._floor)

    def _gemm_time(self, op: _Gemm, m: int) -> float:
        t = op.table(m, op.n, op.k) if op.table is not None else None
        if op.table is not None and m > op.table.largest_m:
            self.coverage.note(op.name, f"{m} rows above the largest measured ({op.table.largest_m:g}): "
                                        "in proportion")
        if t is None:
            if op.table is not None:
                self.coverage.note(op.name, f"{m} rows outside the measured range (roofline)")
            t = self._roofline(op.n * op.k * op.weight_bytes + (m * op.k + m * op.n) * BF16_BYTES,
                               2.0 * m * op.n * op.k, fp8=is_fp8(op.weight_bytes))
        return t * self.p.scale_gemm

    def _moe_time(self, tokens: int) -> float:
        s, tp = self.spec, self.par.tp
        t = self._moe_curve(tokens) if self._moe_curve is not None else None
        if self._moe_curve is not None and tokens > self._moe_curve.largest:
            self.coverage.note("moe.experts", f"{tokens} tokens above the largest measured "
                                              f"({self._moe_curve.largest:g}): in proportion")
        touched = distinct_experts(s.num_experts, s.top_k, tokens)
        imb = ep_imbalance(s.num_experts, self.par.ep, touched)

        def roofline(imbalance: float) -> float:
            return self._roofline(touched * s.expert_bytes * imbalance / tp,
                                  2.0 * tokens * s.top_k * s.expert_params / tp, self.p.eta_expert,
                                  fp8=is_fp8(s.expert_bytes_per_param))

        if t is None:
            if self._moe_curve is not None:
                self.coverage.note("moe.experts", f"{tokens} tokens outside the measured range")
            t = roofline(1.0 if self.par.eplb else imb)
        elif self.par.eplb and imb > 1.0:
            # the table's routing is skewed as a trained router's is, its busiest EP rank setting the
            # time; EPLB evens the ranks' shares: the roofline's relief from that imbalance, applied
            t *= roofline(1.0) / roofline(imb)
        return t * self.p.scale_moe

    def _elementwise_time(self, tokens: int, kernels: int, elems_per_token: float | None = None) -> float:
        """``kernels`` memory-bound kernels moving ``elems_per_token`` BF16 elements per token (default:
        each reads and writes the hidden state once)."""
        per_token = kernels * 2 * self.spec.hidden if elems_per_token is None else elems_per_token
        bytes_ = tokens * per_token * BF16_BYTES
        return max(bytes_ / (self.p.eta_mem * self._bw), kernels * self._floor)

    def _attention_elementwise_elems(self) -> float:
        """Elements one token moves per layer outside the attention block's GEMMs and kernel, on one GPU:
        two fused add-RMSNorms (each reads and writes the hidden state and the residual), rotary (reads and
        writes the rotated part of q and k) and the KV-cache store (reads k and v, writes them)."""
        s, tp = self.spec, self.par.tp
        norms = 2 * 4 * s.hidden
        if s.attention == "mla":
            rotated = self._heads * s.qk_rope_head_dim + s.qk_rope_head_dim
            stored = s.kv_lora_rank + s.qk_rope_head_dim
        else:
            kv_heads = max(s.num_kv_heads // tp, 1)
            rotated = (self._heads + kv_heads) * s.qk_head_dim
            stored = 2 * kv_heads * s.qk_head_dim
        return norms + 2 * rotated + 2 * stored

    def _attention_time(self, shape: BatchShape) -> float:
        """One layer's attention kernel(s) for ``shape``. Beyond a table's edge (a longer context than its
        last row, a larger batch) the nearest measured point is scaled by the roofline's growth from there
        to the query: no step at the edge, and past it time grows as the work does (KV bytes in decode,
        FLOPs in prefill)."""
        s = self.spec
        seqs = max(shape.seqs, 1)
        k = self._attn_kernels
        phase = "generation" if shape.decode else "context"
        # decode: the mean context read; prefill: the prompt length giving this batch's attention work
        length = (max(shape.kv_read_tokens / seqs, 1.0) if shape.decode
                  else max(math.sqrt(2.0 * shape.attn_ctx / seqs), 1.0))
        surface = k.get(phase)
        t: float | None = None
        if surface is not None:
            b, n = surface.clamp(seqs, length)  # type: ignore[attr-defined]
            t = surface(b, n)  # type: ignore[operator]
            if t is not None and (b, n) != (seqs, length):
                self.coverage.note(f"attention.{phase}", f"batch {seqs} at length {length:.0f} beyond the "
                                                          "measured points: scaled from the nearest by the "
                                                          "roofline's growth")
                t *= self._attention_roofline(seqs, length, shape.decode) / self._attention_roofline(
                    b, n, shape.decode)
            if t is not None and shape.decode and s.attention == "mla":
                bmm = 0.0
                for name in ("bmm_pre", "bmm_post"):
                    curve = k.get(name)
                    y = curve(curve.clamp(seqs)) if curve is not None else None  # type: ignore[attr-defined]
                    if y is None:
                        t = None
                        break
                    bmm += y * seqs / curve.clamp(seqs)  # type: ignore[attr-defined]  # in proportion
                if t is not None:
                    t += bmm
        if t is None:
            if surface is not None:
                self.coverage.note(f"attention.{phase}", f"batch {seqs} not measured (roofline)")
            t = self._attention_roofline(seqs, length, shape.decode)
        if shape.width > 1:
            # a speculative step: each request's queries read its KV once (the tables' decode kernel), but
            # there are width of them; where that makes the kernel compute-bound the roofline says how much
            t *= (self._attention_roofline(seqs, length, shape.decode, shape.width)
                  / self._attention_roofline(seqs, length, shape.decode))
        return t * self.p.scale_attention

    def _attention_roofline(self, seqs: float, length: float, decode: bool, width: int = 1) -> float:
        """The roofline's per-layer attention time of ``seqs`` sequences of ``length``: a decode reads
        each context's KV (once for all ``width`` queries of a speculative step); a prefill of whole
        prompts attends causally (stage 0's layers, all alike)."""
        st = self.roofline.stages[0]
        if decode:
            return self._roofline(seqs * length * st.kv_bytes_per_token / st.layers,
                                  width * seqs * length * st.attn_flops(True) / st.layers)
        return self._roofline(0.0, seqs * length * (length + 1) / 2 * st.attn_flops(False) / st.layers)

    # -- the source's interface --------------------------------------------------------------------------

    def _token_costs(self, tokens: int, seqs: int, decode: bool, graph: bool
                     ) -> tuple[float, float, float, float]:
        """Per-layer seconds that depend only on the token count: (attention GEMMs + elementwise,
        dense MLP, MoE layer, LM head + head elementwise)."""
        attn = sum(self._gemm_time(g, tokens) for g in self._attn_gemms)
        if not decode and self._kv_b is not None:
            attn += self._gemm_time(self._kv_b, tokens)
        # vLLM's fused all-reduce runs the two add-RMSNorms in its own kernel: their bytes stay, their
        # launches go
        attn += self._elementwise_time(tokens, ELEMENTWISE_KERNELS_PER_LAYER - 2 * self._fuses(tokens),
                                       self._attn_elementwise)
        if self.spec.qk_norm_over_heads:  # reads q and k twice (sums, then scaling), writes them once
            attn += self._elementwise_time(tokens, QK_NORM_KERNELS, 3 * self._qk_width)
        # silu_and_mul reads the gate and up halves and writes their product: 3 x the GPU's MLP width
        dense = (sum(self._gemm_time(g, tokens) for g in self._dense_gemms)
                 + self._elementwise_time(tokens, ELEMENTWISE_KERNELS_DENSE_MLP,
                                          3 * self.spec.dense_inter / self.par.tp))
        moe = 0.0
        if self.spec.is_moe:
            router, *shared = self._moe_gemms
            routed_t = self._moe_time(tokens)
            if self._fused_shared:  # top-(k+1): every token's work and expert reads grow by one expert
                experts_t = routed_t * (self.spec.top_k + 1) / self.spec.top_k
            else:
                shared_t = sum(self._gemm_time(g, tokens) for g in shared)
                overlapped = self._dual_stream and graph and tokens <= DUAL_STREAM_TOKENS
                experts_t = max(shared_t, routed_t) if overlapped else shared_t + routed_t
            moe = (self._gemm_time(router, tokens) + experts_t
                   + self._elementwise_time(tokens, ELEMENTWISE_KERNELS_PER_MOE_LAYER))
        head = self._gemm_time(self._head, seqs) + self._elementwise_time(seqs, ELEMENTWISE_KERNELS_HEAD)
        return attn, dense, moe, head

    def family_times(self, stage: int, shape: BatchShape) -> dict[str, float]:
        """Seconds per operator family of one forward of ``shape`` on ``stage``: attention (projections,
        kernel, elementwise), dense MLP, MoE, LM head."""
        st = self.roofline.stages[stage]
        attn, dense, moe, head = self._layer_cache(shape.tokens, shape.logit_rows, shape.decode,
                                                   self.roofline.uses_cuda_graph(shape))
        return {"attention": st.layers * (attn + self._attention_cached(shape)),
                "dense_mlp": (st.layers - st.moe_layers) * dense, "moe": st.moe_layers * moe,
                "lm_head": head if st.last else 0.0}

    def gpu_time(self, stage: int, shape: BatchShape) -> float:
        # family_times summed, without building its dict: called for every stage of every micro-batch
        st = self.roofline.stages[stage]
        attn, dense, moe, head = self._layer_cache(shape.tokens, shape.logit_rows, shape.decode,
                                                   self.roofline.uses_cuda_graph(shape))
        t = (st.layers * (attn + self._attention_cached(shape)) + (st.layers - st.moe_layers) * dense
             + st.moe_layers * moe)
        return t + head if st.last else t

    def allreduce(self, tokens: int, graph: bool) -> float:
        """One TP all-reduce of ``tokens`` hidden states, replayed from a graph or launched eagerly (the
        roofline's outside the measured range), before ``scale_comm``."""
        cost = self.roofline
        elems = tokens * self.spec.hidden
        fused = self._fused(elems) if self._fuses(tokens) else None
        if fused is not None:
            return fused + cost.allreduce_wait()
        curve = self._allreduce[graph]
        one = curve(elems) if curve is not None else None
        if one is None:
            if curve is not None:
                self.coverage.note("allreduce", f"{elems} elements outside the measured range")
            return cost.allreduce_time(tokens, graph)
        return one + cost.allreduce_wait()

    def message_allreduce(self, elems: float, graph: bool) -> float | None:
        """One TP all-reduce of ``elems`` BF16 elements, before ``scale_comm``; a message below the
        smallest measured one takes its time (the flat, latency-bound end of the table)."""
        curve = self._allreduce[graph]
        if curve is None:
            return None
        one = curve(max(elems, curve.xs[0]))
        return None if one is None else one + self.roofline.allreduce_wait()

    def comm_time(self, stage: int, shape: BatchShape, graph: bool) -> float:
        if self.par.tp == 1:
            return 0.0
        st, cost = self.roofline.stages[stage], self.roofline
        one = self.allreduce(shape.tokens, graph)
        t = 2 * st.layers * one
        if self.par.ep > 1 and self.par.moe_a2a_backend != "none":
            # the MoE layer's all-reduce becomes a dispatch and a combine (no table: the roofline's)
            t += st.moe_layers * (2 * cost.a2a_time(shape.tokens) - one)
        if st.last:  # vocab-parallel logits gathered before sampling: no table, the roofline's
            t += cost.logits_gather_time(shape.logit_rows)
        return t * self.p.scale_comm


def _call(fn: object, *args: float) -> float | None:
    return fn(*args) if fn is not None else None  # type: ignore[operator]
