"""Roofline cost of one forward step of a micro-batch on one pipeline stage, plus hop and host costs.

    gpu     = max(bytes / (eta_mem * BW), flops / (eta_compute * peak), kernels * kernel_floor)
    host    = graph_launch (decode replayed from a CUDA graph)
              or kernels * (host_op + kernel_launch)   (eager: every kernel dispatched from Python)
    t_stage = gpu + t_comm + host                      (CUDA graph: the replay is one short call)
            = max(gpu + t_comm, host)                  (eager, were host and GPU to overlap fully)
              + loss x min(gpu + t_comm, host)          (a prefill: what does not overlap, CostParams.
                                                        prefill_overlap_loss, 1 as SGLang measured it)

Every constant is explained in docs/simulator.md; the defaults in ``CostParams`` are engine-side
(software) constants, the hardware ones come from the profile (``HardwareConf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from simulator.cuda_graphs import replayed_batch
from simulator.model_spec import BF16_BYTES, ModelSpec, is_fp8
from vocab.hardware import HardwareConf

# A QK norm over all heads (ModelSpec.qk_norm_over_heads): one kernel sums the squares of q and of k per
# token, one scales them; under TP the two per-token sums (FP32) are all-reduced between them (vLLM's
# MiniMaxText01RMSNormTP.forward_qk, SGLang's MiniMaxM2RMSNormTP)
QK_NORM_KERNELS = 2
QK_NORM_SUMS_BYTES = 2 * 4


@dataclass(frozen=True)
class CostParams:
    # Fraction of peak DRAM bandwidth that weight-streaming GEMV/GEMM and attention kernels reach at
    # decode batch sizes (BF16 dense layers, KV reads).
    eta_mem: float = 0.75
    # Same for the routed-expert path (fused MoE / Marlin-style grouped GEMMs with INT4 dequant):
    # scattered expert loads and small per-expert tiles reach less of peak.
    eta_expert: float = 0.60
    # Fraction of dense BF16 tensor-core peak reached by prefill GEMMs (MFU of a well-tuned prefill).
    eta_compute: float = 0.60
    # Fraction of link bandwidth NCCL reaches for medium messages (bus-bandwidth efficiency).
    eta_link: float = 0.70
    # Shortest time the GPU spends on any kernel (launch-to-completion of a tiny kernel on the device).
    kernel_floor_us: float = 2.0
    # Kernels launched per layer in an eager forward (host cost = kernels x (host_op_us + kernel_launch_us)).
    kernels_attn_gqa: int = 8  # norm, qkv GEMM, rope, kv store, attention, o GEMM, residual, misc
    kernels_attn_mla: int = 14  # + q_a/q_b, kv_a/kv_b, latent norm, absorbed projections
    kernels_dense_mlp: int = 4  # norm, gate_up GEMM, act, down GEMM
    kernels_moe: int = 10  # router GEMM, top-k, align/sort, 2 grouped GEMMs, act, combine, 3 shared
    kernels_tp_collective: int = 1  # per all-reduce
    # vLLM (V1) splits its compiled model at the attention op: a step that is not a plain decode replays
    # the pieces between them from CUDA graphs and launches the op itself eagerly, its KV-cache write and
    # its attention kernel (vllm/config/compilation.py: splitting_ops, cudagraph_mode FULL_AND_PIECEWISE)
    kernels_attn_split: int = 2
    kernels_head: int = 8  # final norm, LM head GEMM, logits gather, sampling
    # Host (CPU) time per kernel of an eager forward beyond the profile's kernel_launch_us (ATen
    # dispatcher + cudaLaunchKernel): the Python that SGLang runs around each kernel. The module call and
    # the layer's forward (3-5 us), the custom-op binding of sgl_kernel/flashinfer/NCCL calls (3-5 us),
    # Triton's Python JIT launcher for Triton kernels (~9 us a call), the output tensor from the caching
    # allocator (1-2 us) and about one non-launching op per kernel (view, reshape, dtype/shape checks,
    # 2-5 us): 15-25 us, 20 taken. Each TP/PP rank is its own process on its own core, so ranks dispatch
    # in parallel. Cross-check: SGLang decoding GPT-2 (~165 kernels a step) eagerly on an H200 runs about
    # 4.9 ms a token against 1.0 ms with CUDA graphs, (4.9 - 0.8 scheduler) / 165 = 25 us per kernel
    # = 20 + 5. It depends on the CPU's single-thread speed and the Python/PyTorch versions: fit it per
    # deployment (calibration profiles override it).
    host_op_us: float = 20.0
    # Host work of one scheduler iteration with a batch, in the parts SGLang's loop runs them
    # (docs/simulator.md, "What each stage's host does"). Their sum, 800 us + 15 us a request, is one
    # iteration of SGLang's Python scheduler at small batch (0.5-1.5 ms: why the overlap scheduler
    # exists). pp=1 pays the sum once per step (hidden beside the GPU by the overlap scheduler); under PP
    # every stage pays poll, schedule, prepare and process for every micro-batch, stage 0 also streams.
    # get_next_batch_to_run with a batch: merge and filter the running batch, prepare_for_decode (KV
    # slots, sequence lengths)
    sched_base_us: float = 300.0
    sched_per_req_us: float = 5.0
    # run_batch up to the launch: ForwardBatch from the ScheduleBatch, host-to-device copies, the
    # attention backend's metadata for the replay
    prepare_base_us: float = 250.0
    prepare_per_req_us: float = 4.0
    # process_batch_result: the ids to the host, each request's tokens, stop checks, freeing, the log line
    process_base_us: float = 170.0
    process_per_req_us: float = 5.0
    # stream_output: the batch's new tokens to the detokenizer over ZMQ (PP rank 0 only)
    stream_base_us: float = 50.0
    stream_per_req_us: float = 1.0
    # every pass of the loop, with a batch or without: poll the tokenizer socket (or receive the relay),
    # get_next_batch_to_run finding nothing to do
    poll_us: float = 30.0
    # PP: the CPU (gloo) group's point-to-point messages, TCP on 127.0.0.1, as SGLang sends them (a size,
    # then the pickle): measured by scripts/gloo_p2p.py (data/host/gloo_p2p.json; docs/simulator.md,
    # "Host costs"), the 10th percentile of 2,000 repetitions on a 2-vCPU VM, an upper bound for a GPU
    # server's cores. gloo_send / gloo_recv: the host time one side spends on a request-list relay (an
    # empty list in steady decode: one message); object_send / object_recv: on a tensor dict's metadata
    # (send_object / recv_object: two messages), the NCCL part of which runs on the GPU. gloo_latency:
    # what a message takes beyond those two sides' own time (within the measurement's resolution here).
    gloo_latency_us: float = 10.0
    gloo_send_us: float = 94.0
    gloo_recv_us: float = 156.0
    object_send_us: float = 150.0
    object_recv_us: float = 265.0
    # Measured step costs only (simulator/measured_costs.py): a calibration profile's scale on each
    # operator family's measured time, for a deployment whose kernels run faster or slower than the GPU
    # the tables were measured on (clocks, power cap, driver).
    scale_gemm: float = 1.0
    scale_attention: float = 1.0
    scale_moe: float = 1.0
    scale_comm: float = 1.0
    # Candidate terms, held to measurements by benchmarks/fidelity_terms.py (docs/fidelity.md, "Pricing
    # what a step is missing"); 0 until one is kept. allreduce_wait_us: the spread of the ranks' arrival
    # at an all-reduce inside a forward, each collective waiting for the slowest of the TP group:
    # sigma x sqrt(2 ln tp) per all-reduce (the expected maximum of tp such lags). request_path_us: a
    # request's way from the client to the scheduler and its first token's way back (HTTP, tokenizer and
    # detokenizer processes), charged at once as a later arrival (the TTFT sees their sum), in virtual
    # time only (a live engine has its real front end).
    allreduce_wait_us: float = 0.0
    request_path_us: float = 0.0
    # prefill_overlap_loss: the share of the shorter side (host dispatch or GPU work) of an eager prefill
    # (extend) forward that does not overlap the other; 0 is full overlap, max(GPU, host), 1 one after the
    # other, GPU + host. 1: SGLang measured a DeepSeek-V3 prefill of one token at 82.6 ms eager against
    # 23.1 ms from a CUDA graph (sgl-project/sglang pull request 12160): the host's 59.5 ms and the GPU's
    # 23.1 one after the other. Held to the served rows out of sample (benchmarks/fidelity_terms.py) and
    # to the published corpus, which it did not come from (docs/fidelity.md). An eager decode step keeps
    # the full overlap: SGLang's bench_one_batch decoding Llama-3-8B eagerly at batch 1 measured 8.2-9.3 ms
    # against ~7.3 ms from a graph and some 10 ms of dispatch, the two overlapped.
    prefill_overlap_loss: float = 1.0


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    moe_a2a_backend: str = "none"
    # --enable-eplb: SGLang's expert-parallel load balancer moves (and, with redundant experts, copies)
    # experts so every EP rank gets an even share of the routed tokens
    eplb: bool = False


@dataclass(frozen=True)
class BatchShape:
    """What one forward of a micro-batch processes."""

    tokens: int  # new tokens (decode: one per request; prefill: the chunk's tokens)
    seqs: int  # sequences (LM head rows)
    kv_read_tokens: int  # cached tokens whose KV is read (sum of prefix/context lengths)
    attn_ctx: float  # sum over new tokens of the context each attends to
    decode: bool
    # new tokens per sequence of a decode-mode forward: 1 for a plain decode step; a speculative verify
    # or draft step runs several per request (each gets logits, so the LM head has seqs x width rows)
    width: int = 1

    @property
    def logit_rows(self) -> int:
        """Rows of the LM head: each sequence's last token, or every token of a speculative step."""
        return self.seqs * self.width


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """SGLang's split: even, the remainder goes to the last stages."""
    base, rem = divmod(num_layers, pp)
    return [base + (1 if i >= pp - rem else 0) for i in range(pp)]


def distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected experts touched by ``tokens`` tokens under uniform top-k routing: E(1-(1-k/E)^n)."""
    if num_experts == 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def ep_imbalance(num_experts: int, ep: int, touched: float) -> float:
    """E[max over EP ranks of touched experts] / mean: the slowest rank sets the step time.

    Each rank owns E/ep experts, each touched independently with p = touched/E, so the per-rank count is
    ~Binomial(E/ep, p); the expected maximum of ep such counts is about mean + sd*sqrt(2 ln ep).
    """
    if ep <= 1 or touched <= 0:
        return 1.0
    per_rank = num_experts / ep
    p = min(touched / num_experts, 1.0)
    mean = per_rank * p
    sd = math.sqrt(per_rank * p * (1.0 - p))
    return min(mean + sd * math.sqrt(2.0 * math.log(ep)), per_rank) / mean


class StepCostSource(Protocol):
    """Where the GPU side of a stage's forward gets its price. The roofline below is the default; the
    measured source (``simulator/measured_costs.py``) prices each operator from measured kernel tables.
    Host costs, hops, the scheduler and the pipeline's dynamics stay in :class:`CostModel` whichever
    source prices the kernels."""

    def gpu_time(self, stage: int, shape: BatchShape) -> float:
        """Seconds of kernels of one forward of ``shape`` on ``stage``, collectives excluded."""
        ...

    def family_times(self, stage: int, shape: BatchShape) -> dict[str, float]:
        """Those seconds by operator family: attention, dense_mlp, moe, lm_head."""
        ...

    def allreduce(self, tokens: int, graph: bool) -> float:
        """Seconds of one TP all-reduce of ``tokens`` hidden states."""
        ...

    def message_allreduce(self, elems: float, graph: bool) -> float | None:
        """Seconds of one TP all-reduce of ``elems`` BF16 elements (None: not measured)."""
        ...

    def comm_time(self, stage: int, shape: BatchShape, graph: bool) -> float:
        """Seconds of the stage's TP/EP collectives in that forward (``graph``: replayed from a CUDA
        graph, else launched eagerly)."""
        ...


class BorrowedAllreduce(Protocol):
    """A TP all-reduce measured on another system, pricing a box the roofline prices otherwise
    (``HardwareConf.collective_tables``; ``simulator/borrowed_collectives.py``)."""

    def allreduce(self, elems: float, graph: bool) -> float | None:
        """Seconds of one all-reduce of ``elems`` BF16 elements over the TP group (None: the group's size
        was not measured)."""
        ...


class CostModel:
    def __init__(
        self,
        spec: ModelSpec,
        hw: HardwareConf,
        par: Parallel,
        cuda_graph_max_bs: int,
        disable_cuda_graph: bool,
        params: CostParams | None = None,
        layer_partition: list[int] | None = None,
    ) -> None:
        self.spec = spec
        # None: the roofline prices the kernels; set by ``use_source`` to a measured source
        self.source: StepCostSource | None = None
        # the TP all-reduce measured on another system (``use_collectives``); None: the alpha-beta formula
        self.borrowed: BorrowedAllreduce | None = None
        self.hw = hw
        self.par = par
        self.p = params or CostParams()
        self.cuda_graph_max_bs = cuda_graph_max_bs
        # vLLM's captured sizes count a step's tokens (a speculative verify's k + 1 a request), SGLang's
        # requests; set by the vLLM dialect
        self.graph_in_tokens = False
        self.disable_cuda_graph = disable_cuda_graph
        # vLLM's piecewise CUDA graphs for the steps a full graph does not replay (``host_time``); set by
        # the vLLM dialect unless --enforce-eager
        self.piecewise = False
        # vLLM's FlashInfer all-reduce fused with the RMSNorm after it: the largest all-reduce (bytes) it
        # takes, the custom all-reduce above (0: none; set by the vLLM dialect)
        self.fused_allreduce_bytes = 0
        # SGLANG_PP_LAYER_PARTITION (validated in resolve) overrides SGLang's even split.
        self.stage_layers = (list(layer_partition) if layer_partition
                             else pp_layer_split(spec.num_layers, par.pp))
        tp = par.tp
        self._bw = hw.mem_bw_gbs * 1e9
        self._peak = hw.peak_tflops_bf16 * 1e12
        # FP8-weight GEMMs run on the FP8 tensor cores where the GPU has them (Hopper, Blackwell: twice the
        # BF16 rate); elsewhere the weights are widened and multiplied at the BF16 peak
        self._peak_fp8 = (hw.peak_tflops_fp8 or hw.peak_tflops_bf16) * 1e12
        self._expert_fp8 = is_fp8(spec.expert_bytes_per_param)
        self._link = hw.link_bw_gbs * 1e9 * self.p.eta_link
        # Across nodes (hw.nodes > 1): ranks fill nodes in order, tp fastest, so stage s sits on node
        # s*tp // num_gpus. A TP (or EP) group wider than a node crosses the network in every
        # collective; a stage boundary between nodes sends its hop over it. docs/simulator.md, "Across nodes".
        per_node = max(1, hw.num_gpus)
        spans = hw.nodes > 1
        self._inter_link = hw.internode_bw_gbs * 1e9 * self.p.eta_link
        self._inter_latency = hw.internode_latency_us * 1e-6
        self._tp_inter = spans and tp > per_node
        self._ep_inter = spans and par.ep > per_node
        stage_node = [s * tp // per_node for s in range(par.pp)]
        self._hop_inter = [spans and stage_node[s] != stage_node[s + 1] for s in range(par.pp - 1)]
        self._return_inter = spans and stage_node[0] != stage_node[-1]
        # GQA KV is sharded by kv heads (replicated when kv_heads < tp); MLA's latent cache is the same
        # on every TP rank.
        kv_shard = 1 if spec.attention == "mla" else min(tp, spec.num_kv_heads)
        kv_token_layer = spec.kv_elems_per_token_layer() * spec.kv_bytes_per_elem / kv_shard
        # q.k over the head's key width, attn.v over its value width, for every head of the GPU
        mha_flops_ctx = 2.0 * spec.num_heads * (spec.qk_head_dim + spec.v_head_dim) / tp
        if spec.attention == "mla":  # absorbed MLA decode: q.k over (latent+rope), attn.v over latent
            attn_flops_ctx = 2.0 * spec.num_heads * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim) / tp
        else:
            attn_flops_ctx = mha_flops_ctx
        # Prefill: SGLang runs MLA's extend as plain multi-head attention over keys and values expanded from
        # the latent (kv_b), 3.4x fewer FLOPs per context token than the absorbed form for DeepSeek-V3

        self.stages: list[_Stage] = []
        start = 0
        for s, n in enumerate(self.stage_layers):
            layers = range(start, start + n)
            start += n
            first, last = s == 0, s == par.pp - 1
            n_moe = sum(spec.moe_layer_mask[i] for i in layers)
            ne_bytes = sum(spec.layer_nonexpert_bytes(i) for i in layers) / tp
            ne_params = sum(spec.layer_nonexpert_params(i) for i in layers) / tp
            ne_fp8 = sum(spec.layer_nonexpert_fp8_params(i) for i in layers) / tp
            head_bytes = spec.lm_head_params * spec.lm_head_bytes_per_param / tp if last else 0.0
            embed_bytes = spec.embed_params * spec.embed_bytes_per_param / tp if first else 0.0
            # Experts are split over tp GPUs whether by EP (whole experts) or TP (slices of every expert).
            expert_mem = n_moe * spec.num_experts * spec.expert_bytes / tp
            attn_kernels = n * (self.p.kernels_attn_mla if spec.attention == "mla"
                                else self.p.kernels_attn_gqa)
            if spec.qk_norm_over_heads:
                attn_kernels += n * (QK_NORM_KERNELS + (self.p.kernels_tp_collective if tp > 1 else 0))
            kernels = attn_kernels + n_moe * self.p.kernels_moe + (n - n_moe) * self.p.kernels_dense_mlp
            if tp > 1:
                kernels += 2 * n * self.p.kernels_tp_collective
            kernels += (self.p.kernels_head if last else 0) + (1 if first else 0)
            self.stages.append(
                _Stage(
                    index=s,
                    layers=n,
                    moe_layers=n_moe,
                    nonexpert_bytes=ne_bytes + head_bytes,
                    nonexpert_params=ne_params,
                    nonexpert_fp8_params=ne_fp8,
                    attn_bytes=n * spec.attn_params * spec.attn_bytes_per_param / tp,
                    attn_params=n * spec.attn_params / tp,
                    attn_fp8_params=n * spec.attn_params / tp if is_fp8(spec.attn_bytes_per_param) else 0.0,
                    attn_kernels=attn_kernels,
                    weight_bytes=ne_bytes + head_bytes + embed_bytes + expert_mem,
                    kv_bytes_per_token=kv_token_layer * n,
                    attn_flops_per_ctx=attn_flops_ctx * n,
                    prefill_attn_flops_per_ctx=mha_flops_ctx * n,
                    kernels=kernels,
                    last=last,
                )
            )

    # -- per-step costs -------------------------------------------------------------------------------

    def graph_requests(self, width: int = 1) -> int:
        """The most requests a captured decode graph holds when each runs ``width`` tokens."""
        return max(self.cuda_graph_max_bs // width, 1) if self.graph_in_tokens else self.cuda_graph_max_bs

    def uses_cuda_graph(self, shape: BatchShape) -> bool:
        return shape.decode and not self.disable_cuda_graph and shape.seqs <= self.graph_requests(shape.width)

    def use_source(self, source: StepCostSource) -> None:
        """Price kernels and collectives from ``source`` instead of the roofline."""
        self.source = source

    def use_collectives(self, borrowed: BorrowedAllreduce) -> None:
        """Price the roofline's TP all-reduces within a node from ``borrowed`` (another system's
        measured all-reduce) instead of the alpha-beta formula."""
        self.borrowed = borrowed

    def replayed_shape(self, shape: BatchShape) -> BatchShape:
        """The work a forward of ``shape`` does on the GPU: a decode batch replayed from a CUDA graph is
        padded to the next captured size (simulator/cuda_graphs.py), and its GEMMs, experts and
        collectives run the padded slots' tokens too; the attention of a padded slot (a context of one)
        is nothing beside the real ones', so sequences and contexts stay as they are. Anything else as
        it is."""
        most = self.graph_requests(shape.width)
        if not shape.decode or self.disable_cuda_graph or shape.seqs > most:
            return shape  # eager: as it is
        extra = replayed_batch(shape.seqs, most) - shape.seqs
        if not extra:
            return shape
        return BatchShape(tokens=shape.tokens + extra * shape.width, seqs=shape.seqs,
                          kv_read_tokens=shape.kv_read_tokens, attn_ctx=shape.attn_ctx, decode=True,
                          width=shape.width)

    def gpu_time(self, stage: int, shape: BatchShape) -> float:
        """Seconds of GPU work of one forward of ``shape`` on ``stage``, without collectives: from the
        step-cost source when one is set, else the roofline max of memory, compute and the kernel floor;
        a graph-replayed decode at its padded size (:meth:`replayed_shape`)."""
        shape = self.replayed_shape(shape)
        if self.source is not None:
            return self.source.gpu_time(stage, shape)
        return self.roofline_gpu_time(stage, shape)

    def roofline_gpu_time(self, stage: int, shape: BatchShape) -> float:
        attn, rest = self._roofline_terms(stage, shape, True), self._roofline_terms(stage, shape, False)
        floor = self.stages[stage].kernels * self.p.kernel_floor_us * 1e-6
        return max(attn[0] + rest[0], attn[1] + rest[1], floor)

    def _roofline_terms(self, stage: int, shape: BatchShape, attention: bool) -> tuple[float, float, int]:
        """(memory seconds, compute seconds, kernels) of one forward's attention blocks (``attention``) or
        of the rest of the stage: dense MLPs, shared and routed experts, router, LM head."""
        st = self.stages[stage]
        spec, tp, p = self.spec, self.par.tp, self.p
        n = shape.tokens
        # BF16 work (attention, the LM head, BF16 weights) and FP8-weight GEMMs, each at its own peak
        if attention:
            mem_t = (st.attn_bytes + shape.kv_read_tokens * st.kv_bytes_per_token) / (p.eta_mem * self._bw)
            flops = (2.0 * n * (st.attn_params - st.attn_fp8_params)
                     + shape.attn_ctx * st.attn_flops(shape.decode))
            fp8_flops = 2.0 * n * st.attn_fp8_params
            kernels = st.attn_kernels
        else:
            mem_t = (st.nonexpert_bytes - st.attn_bytes) / (p.eta_mem * self._bw)
            flops = 2.0 * n * (st.nonexpert_params - st.attn_params
                               - (st.nonexpert_fp8_params - st.attn_fp8_params))
            fp8_flops = 2.0 * n * (st.nonexpert_fp8_params - st.attn_fp8_params)
            kernels = st.kernels - st.attn_kernels
            if st.last:
                flops += 2.0 * shape.logit_rows * spec.lm_head_params / tp
            if st.moe_layers:
                touched = distinct_experts(spec.num_experts, spec.top_k, n)
                imb = 1.0 if self.par.eplb else ep_imbalance(spec.num_experts, self.par.ep, touched)
                mem_t += st.moe_layers * touched * spec.expert_bytes * imb / tp / (p.eta_expert * self._bw)
                expert_flops = 2.0 * n * st.moe_layers * spec.top_k * spec.expert_params / tp
                if self._expert_fp8:
                    fp8_flops += expert_flops
                else:
                    flops += expert_flops
        return mem_t, (flops / self._peak + fp8_flops / self._peak_fp8) / p.eta_compute, kernels

    def split_gpu_time(self, stage: int, shape: BatchShape, padded: bool = False) -> tuple[float, float]:
        """Seconds of one forward's GPU work split in two: the attention blocks (projections, the attention
        kernel, their norms and rotary), which see only the sequences of their own rank under attention
        DP, and the rest (dense MLPs, experts, LM head), which see every rank's tokens. The measured
        source's operator families, or each part by the roofline on its own (whose sum can exceed
        :meth:`roofline_gpu_time`, the max of the summed terms). Padding as :meth:`gpu_time` unless
        ``padded`` (the shape is already what the GPU runs)."""
        if not padded:
            shape = self.replayed_shape(shape)
        if self.source is not None:
            f = self.source.family_times(stage, shape)
            return f["attention"], f["dense_mlp"] + f["moe"] + f["lm_head"]
        floor = self.p.kernel_floor_us * 1e-6
        a_mem, a_cmp, a_k = self._roofline_terms(stage, shape, True)
        r_mem, r_cmp, r_k = self._roofline_terms(stage, shape, False)
        return max(a_mem, a_cmp, a_k * floor), max(r_mem, r_cmp, r_k * floor)

    def stage_time(self, stage: int, shape: BatchShape) -> float:
        """Seconds stage ``stage`` is busy with one forward of ``shape``. With a CUDA graph: GPU + comm +
        the replay call. Eager: the host dispatches kernel after kernel; the forward takes the longer of
        the host's dispatch and the GPU's work, and for a prefill the share of the shorter that does not
        overlap (``CostParams.prefill_overlap_loss``)."""
        work = self.gpu_time(stage, shape) + self.comm_time(stage, shape)
        host = self.host_time(stage, shape)
        return self.forward_time(work, host, self.uses_cuda_graph(shape),
                                 shape.decode or self.replays_pieces(shape))

    def forward_time(self, work: float, host: float, graph: bool, ahead: bool) -> float:
        """A forward of ``work`` GPU seconds dispatched in ``host`` seconds: a full graph's replay call
        before its work; a dispatch that runs ahead of the GPU (an eager decode, vLLM's graph pieces)
        beside it; an eager prefill's beside it but for ``CostParams.prefill_overlap_loss`` of the
        shorter."""
        if graph:
            return work + host
        if ahead:
            return max(work, host)
        return max(work, host) + self.p.prefill_overlap_loss * min(work, host)

    def breakdown(self, stage: int, shape: BatchShape) -> dict[str, float]:
        """The parts of ``stage_time`` in seconds: ``gpu`` (roofline max of memory, compute and kernel
        floor), ``comm`` (TP/EP collectives), ``host`` (the host's dispatch: one graph replay, or every
        kernel of an eager forward), ``host_exposed`` (the part of ``host`` not hidden behind GPU work:
        all of a graph replay, max(0, host - gpu - comm) eager), ``eager`` (1.0 when the forward runs
        eagerly, else 0.0) and ``total`` = gpu + comm + host_exposed."""
        gpu, comm = self.gpu_time(stage, shape), self.comm_time(stage, shape)
        host = self.host_time(stage, shape)
        total = self.stage_time(stage, shape)
        eager = not self.uses_cuda_graph(shape)
        return {"gpu": gpu, "comm": comm, "host": host, "host_exposed": total - gpu - comm,
                "eager": float(eager), "total": total}

    def collective_time(self, tokens: int, graph: bool) -> float:
        """One all-reduce of ``tokens`` hidden states over the TP group: the measured source's table
        where it has one (one node), else the roofline's."""
        if self.par.tp == 1:
            return 0.0
        if self.source is not None and not (self._tp_inter or self._ep_inter):
            return self.source.allreduce(tokens, graph) * self.p.scale_comm
        return self.allreduce_time(tokens, graph)

    def qk_norm_allreduce(self, tokens: int, graph: bool) -> float:
        """One layer's all-reduce of ``tokens`` tokens' QK-norm sums of squares over the TP group (0 where
        the model normalises head by head, or one GPU holds every head): the measured all-reduce of its
        (small) size where the source has one, else the roofline's."""
        if not self.spec.qk_norm_over_heads or self.par.tp == 1:
            return 0.0
        nbytes = tokens * QK_NORM_SUMS_BYTES
        if self.source is not None and not (self._tp_inter or self._ep_inter):
            t = self.source.message_allreduce(nbytes / BF16_BYTES, graph)
            if t is not None:
                return t * self.p.scale_comm
        return self.message_allreduce_time(nbytes, graph)

    def comm_time(self, stage: int, shape: BatchShape) -> float:
        shape = self.replayed_shape(shape)  # a padded graph all-reduces its padded rows too
        graph = self.replays_collectives(shape)
        qk_norm = self.stages[stage].layers * self.qk_norm_allreduce(shape.tokens, graph)
        # measured collective tables are of one node: a group across nodes is priced by the network
        if self.source is not None and not (self._tp_inter or self._ep_inter):
            return self.source.comm_time(stage, shape, graph) + qk_norm
        return self.roofline_comm_time(stage, shape, graph) + qk_norm

    def replays_pieces(self, shape: BatchShape) -> bool:
        """vLLM replays the step from its piecewise CUDA graphs: not a fully replayed decode, and its
        tokens fit the largest captured size."""
        return self.piecewise and not self.uses_cuda_graph(shape) and shape.tokens <= self.cuda_graph_max_bs

    def replays_collectives(self, shape: BatchShape) -> bool:
        """The step's all-reduces run inside CUDA graphs: a replayed decode, or vLLM's graph pieces."""
        return self.uses_cuda_graph(shape) or self.replays_pieces(shape)

    def roofline_comm_time(self, stage: int, shape: BatchShape, graph: bool = False) -> float:
        st = self.stages[stage]
        if self.par.tp == 1:
            return 0.0
        allreduce = self.allreduce_time(shape.tokens, graph)
        # Attention output and MLP output are each all-reduced; with an all-to-all MoE backend the MoE
        # layer's all-reduce becomes a dispatch and a combine of the k routed copies of each token.
        t = st.layers * allreduce + (st.layers - st.moe_layers) * allreduce
        if self.par.ep > 1 and self.par.moe_a2a_backend != "none":
            t += st.moe_layers * 2 * self.a2a_time(shape.tokens)
        else:
            t += st.moe_layers * allreduce
        if st.last:
            t += self.logits_gather_time(shape.logit_rows)
        return t

    # -- roofline collectives, one at a time (the measured source's fallback too) ------------------------

    def allreduce_wait(self) -> float:
        """Seconds an all-reduce inside a forward waits for the slowest of the TP group's ranks
        (``CostParams.allreduce_wait_us``)."""
        wait, tp = self.p.allreduce_wait_us, self.par.tp
        return wait * 1e-6 * math.sqrt(2.0 * math.log(tp)) if wait and tp > 1 else 0.0

    def allreduce_time(self, tokens: int, graph: bool = False) -> float:
        """One TP all-reduce of ``tokens`` hidden states (ring, alpha-beta, or the borrowed table)."""
        return self.message_allreduce_time(tokens * self.spec.hidden * BF16_BYTES, graph)

    def message_allreduce_time(self, act: float, graph: bool = False) -> float:
        """One TP all-reduce of ``act`` bytes: within a node, the borrowed measured all-reduce where the
        profile names one (``graph``: its CUDA-graph lane, else the eager one), else ring alpha-beta. A TP
        group wider than a node runs at the network's bandwidth per GPU, every ring crossing it, with its
        latency added."""
        tp = self.par.tp
        if self.borrowed is not None and not self._tp_inter:
            t = self.borrowed.allreduce(act / BF16_BYTES, graph)
            if t is not None:
                return t + self.allreduce_wait()
        if self._tp_inter:
            return ((self.hw.allreduce_latency_us * 1e-6 + self._inter_latency)
                    + 2.0 * (tp - 1) / tp * act / self._inter_link + self.allreduce_wait())
        return (self.hw.allreduce_latency_us * 1e-6 + 2.0 * (tp - 1) / tp * act / self._link
                + self.allreduce_wait())

    def a2a_time(self, tokens: int) -> float:
        """One all-to-all MoE dispatch (or combine) of the k routed copies of ``tokens`` hidden states."""
        ep = self.par.ep
        act = tokens * self.spec.hidden * BF16_BYTES
        if self._ep_inter:  # the copies bound for other nodes' ranks cross the network, the rest NVLink
            per_node = self.hw.num_gpus
            inter = act * self.spec.top_k * (ep - per_node) / ep / self._inter_link
            intra = act * self.spec.top_k * (per_node - 1) / ep / self._link
            return self.hw.allreduce_latency_us * 1e-6 + self._inter_latency + max(inter, intra)
        return self.hw.allreduce_latency_us * 1e-6 + act * self.spec.top_k * (ep - 1) / ep / self._link

    def logits_gather_time(self, seqs: int) -> float:
        """The last stage's all-gather of vocab-parallel logits before sampling."""
        tp = self.par.tp
        return (self.hw.allreduce_latency_us * 1e-6
                + (tp - 1) / tp * seqs * self.spec.vocab * BF16_BYTES / self._link)

    def host_time(self, stage: int, shape: BatchShape) -> float:
        """Host (CPU) seconds stage ``stage``'s scheduler process spends launching one forward: one
        cudaGraphLaunch, or, eager, every kernel through SGLang's Python, PyTorch's dispatcher and the
        driver."""
        return self.dispatch_time(stage, self.uses_cuda_graph(shape), self.replays_pieces(shape))

    def dispatch_time(self, stage: int, graph: bool, pieces: bool) -> float:
        """Host seconds to launch one forward on ``stage``: one graph replay (``graph``); vLLM's piecewise
        graphs (``pieces``: the attention op eagerly in every layer, a graph piece per layer and one more
        around it); else every kernel, as a step above vLLM's largest captured size (the compiled model
        without graphs, launched from Python) is priced too."""
        if graph:
            return self.hw.graph_launch_us * 1e-6
        st = self.stages[stage]
        launch = (self.p.host_op_us + self.hw.kernel_launch_us) * 1e-6
        if pieces:
            return (st.layers * self.p.kernels_attn_split * launch
                    + (st.layers + 1) * self.hw.graph_launch_us * 1e-6)
        return st.kernels * launch

    def hop_time(self, shape: BatchShape, boundary: int = 0) -> float:
        """Stage ``boundary`` -> ``boundary`` + 1: hidden states and residual of every new token, point
        to point; over the network when the two stages sit on different nodes."""
        nbytes = 2 * shape.tokens * self.spec.hidden * BF16_BYTES
        if self._hop_inter and self._hop_inter[boundary]:
            return self.hw.link_latency_us * 1e-6 + self._inter_latency + nbytes / self._inter_link
        return self.hw.link_latency_us * 1e-6 + nbytes / (self.hw.link_bw_gbs * 1e9 * self.p.eta_link)

    def hop_times(self, shape: BatchShape) -> list[float]:
        """Every stage boundary's hop, in order (empty without PP)."""
        return [self.hop_time(shape, b) for b in range(self.par.pp - 1)]

    def output_time(self, sender: int) -> float:
        """The NCCL send of a micro-batch's sampled ids (a few bytes a request) from stage ``sender`` to the
        next stage round the ring (the last stage's go to stage 0): the link's latency, the network's too
        when the two stages sit on different nodes."""
        last = self.par.pp - 1
        inter = self._return_inter if sender == last else bool(self._hop_inter) and self._hop_inter[sender]
        return self.hw.link_latency_us * 1e-6 + (self._inter_latency if inter else 0.0)

    def host_costs(self) -> HostCosts:
        """The host side of SGLang's PP loop, per stage (``simulator/pp_loop.py``)."""
        p, last = self.p, self.par.pp - 1
        # a gloo message between stages on different nodes crosses the network (TCP) too
        latency = [p.gloo_latency_us * 1e-6 + (
            self._inter_latency if (self._return_inter if k == last else self._hop_inter[k]) else 0.0)
            for k in range(self.par.pp)] if self.par.pp > 1 else [0.0]
        us = 1e-6
        return HostCosts(
            gloo_latency=latency, poll=p.poll_us * us, gloo_send=p.gloo_send_us * us,
            gloo_recv=p.gloo_recv_us * us, object_send=p.object_send_us * us,
            object_recv=p.object_recv_us * us,
            # with tp > 1 the relayed list also goes to the stage's other TP ranks: a gloo broadcast
            tp_broadcast=(p.gloo_latency_us + p.gloo_recv_us) * us if self.par.tp > 1 else 0.0,
            sched_base=p.sched_base_us * us, sched_per_req=p.sched_per_req_us * us,
            prepare_base=p.prepare_base_us * us, prepare_per_req=p.prepare_per_req_us * us,
            process_base=p.process_base_us * us, process_per_req=p.process_per_req_us * us,
            stream_base=p.stream_base_us * us, stream_per_req=p.stream_per_req_us * us)

    def sched_time(self, num_reqs: int) -> float:
        """Host time of one scheduler iteration of a batch of ``num_reqs`` requests on one process: poll,
        schedule, prepare the forward, process the result and stream it (pp=1)."""
        h = self.host_costs()
        return h.poll + h.schedule(num_reqs) + h.prepare(num_reqs) + h.process(num_reqs) + h.stream(num_reqs)

    # -- analytic helpers (diagnostics, tests, predictions) ---------------------------------------------

    def ring_trip(self, shape: BatchShape, overlap: bool = False) -> float:
        """One micro-batch's trip from stage-0 launch back to its next launch, with no queueing.

        ``overlap``: pp=1 with the overlap scheduler, where the scheduler's host work runs beside the GPU
        step on the thread that also dispatches the forward, so the step is max(GPU side, host side).
        Under PP the stages' forwards and hops, the sampled ids back to stage 0 (its gloo metadata and
        NCCL send) and stage 0's host work between the ids landing and the next launch: process the
        result and stream it, poll, schedule, prepare (docs/simulator.md, "What each stage's host
        does"; ``pp_loop.py`` has the rest, which depends on what else is in flight)."""
        if overlap and self.par.pp == 1:
            return max(self.stage_time(0, shape), self.sched_time(shape.seqs) + self.host_time(0, shape))
        if self.par.pp == 1:
            return self.stage_time(0, shape) + self.sched_time(shape.seqs)
        h, b, last = self.host_costs(), shape.seqs, self.par.pp - 1
        t = sum(self.stage_time(s, shape) for s in range(self.par.pp)) + sum(self.hop_times(shape))
        t += max(self.output_time(last), h.gloo_latency[last] + h.object_recv)
        return t + h.process(b) + h.stream(b) + h.poll + h.schedule(b) + h.prepare(b)


@dataclass(frozen=True)
class HostCosts:
    """Seconds of host work in SGLang's scheduler loop, by part (``CostParams`` has the microseconds and
    why). ``gloo_latency[k]``: a gloo message from stage k to the next stage round the ring."""

    gloo_latency: list[float]
    poll: float
    gloo_send: float
    gloo_recv: float
    object_send: float
    object_recv: float
    tp_broadcast: float  # the request list to the stage's other TP ranks, every pass (tp > 1)
    sched_base: float
    sched_per_req: float
    prepare_base: float
    prepare_per_req: float
    process_base: float
    process_per_req: float
    stream_base: float
    stream_per_req: float

    def schedule(self, reqs: int) -> float:
        """get_next_batch_to_run: nothing to build for an empty slot (the pass's poll covers it)."""
        return self.sched_base + self.sched_per_req * reqs if reqs else 0.0

    def prepare(self, reqs: int) -> float:
        return self.prepare_base + self.prepare_per_req * reqs

    def process(self, reqs: int) -> float:
        return self.process_base + self.process_per_req * reqs

    def stream(self, reqs: int) -> float:
        return self.stream_base + self.stream_per_req * reqs


@dataclass(frozen=True)
class _Stage:
    index: int
    layers: int
    moe_layers: int
    nonexpert_bytes: float  # read every step, per GPU (incl. LM head on the last stage)
    nonexpert_params: float  # per GPU, multiplied by tokens for FLOPs
    nonexpert_fp8_params: float  # of those, the ones stored in FP8
    attn_bytes: float  # of nonexpert_bytes, the attention blocks' projections
    attn_params: float  # of nonexpert_params, the same
    attn_fp8_params: float  # of those, the ones stored in FP8
    attn_kernels: int  # of kernels, the attention blocks'
    weight_bytes: float  # resident per GPU (incl. embedding, all experts)
    kv_bytes_per_token: float  # per GPU, all of this stage's layers
    attn_flops_per_ctx: float  # per GPU, per (new token x context token), all layers: decode
    prefill_attn_flops_per_ctx: float  # the same for a prefill (MLA: the expanded, non-absorbed form)
    kernels: int  # kernels of one eager forward
    last: bool

    def attn_flops(self, decode: bool) -> float:
        return self.attn_flops_per_ctx if decode else self.prefill_attn_flops_per_ctx


def decode_shape(context_lens: list[int] | tuple[int, ...]) -> BatchShape:
    """One decode step of requests with these context lengths (one new token each)."""
    n = len(context_lens)
    ctx = sum(context_lens)
    return BatchShape(tokens=n, seqs=n, kv_read_tokens=ctx, attn_ctx=float(ctx), decode=True)


def prefill_shape(chunks: list[tuple[int, int]]) -> BatchShape:
    """One prefill of ``(tokens, prefix)`` chunks: each computes ``tokens`` new prompt tokens after
    ``prefix`` already cached ones, reads the prefix's KV and attends causally over prefix + itself."""
    tokens = sum(t for t, _ in chunks)
    kv_read = sum(p for _, p in chunks)
    attn = sum(t * p + t * (t + 1) / 2 for t, p in chunks)
    return BatchShape(tokens=tokens, seqs=len(chunks), kv_read_tokens=kv_read, attn_ctx=attn, decode=False)
