"""One lockstep forward of every attention-DP rank's batch.

Each rank runs its attention blocks on its own batch, on its ``T / D`` GPUs; at every MLP or MoE layer
the ranks meet: without an all-to-all backend each rank's hidden states are gathered to all ``T`` GPUs,
which run the dense MLPs and experts over every rank's tokens as a TP group does, and scattered back
(two collectives of the gathered tokens a layer, as many as a TP layer's two all-reduces); with DeepEP
the MoE layer instead dispatches each rank's tokens to the GPUs holding their experts and combines the
results (priced from aiconfigurator-core's DeepEP tables where the GPU has them, else from the link's
bandwidth and latency), and only the dense layers gather.

Because every collective waits for all ranks, a forward takes the slowest rank's attention plus the
shared part. A rank with nothing to run still takes part with an idle batch; a decode forward replayed
from CUDA graphs pads every rank to the graph of the largest rank's batch, and any rank's prefill makes
the whole forward eager (SGLang decides both across ranks). What is left out is in docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.attention_dp.layout import AttentionDP
from simulator.costs import BatchShape, CostModel
from simulator.cuda_graphs import replayed_batch
from simulator.kernel_tables import Curve, KernelTables


@dataclass(frozen=True)
class LockstepStep:
    """Seconds of one lockstep forward: GPU work, collectives, the host's dispatch, and in all."""

    attention: float  # the slowest rank's attention blocks
    shared: float  # dense MLPs, experts and LM head over every rank's tokens
    comm: float
    dispatch: float  # the host's launch of the forward, with the ranks' exchange of batch sizes
    graph: bool
    total: float  # as a single engine's forward: a graph's launch before its work; an eager forward's
    # dispatch beside it (a prefill's not fully: CostParams.prefill_overlap_loss)


class LockstepCosts:
    """Prices a lockstep forward. ``rank_cost``: the model at the rank's attention TP (its attention
    blocks); ``group_cost``: the model at the full TP (everything the ranks share); ``tables``: the GPU's
    measured kernel tables, for DeepEP's dispatch and combine (None: the roofline's)."""

    def __init__(self, layout: AttentionDP, rank_cost: CostModel, group_cost: CostModel,
                 tables: KernelTables | None) -> None:
        self.layout, self.rank_cost, self.group_cost = layout, rank_cost, group_cost
        # every iteration the ranks' schedulers exchange their batches' sizes and modes on the CPU group
        # before the forward (prepare_mlp_sync_batch): one gloo collective
        p = group_cost.p
        self.sync_s = (p.gloo_latency_us + p.gloo_recv_us) * 1e-6
        spec = group_cost.spec
        self._deepep: dict[str, Curve | None] = {}
        if layout.a2a == "deepep" and tables is not None:
            for mode in ("normal", "low_latency"):
                self._deepep[mode] = tables.deepep(mode, spec.hidden, spec.top_k, spec.num_experts)

    def graph(self, shapes: list[BatchShape | None]) -> bool:
        """Whether the forward replays CUDA graphs: every busy rank decoding, the largest within the
        captured sizes."""
        busy = [s for s in shapes if s is not None]
        g = self.group_cost
        return (bool(busy) and all(s.decode for s in busy) and not g.disable_cuda_graph
                and max(s.seqs for s in busy) <= g.cuda_graph_max_bs)

    def step(self, shapes: list[BatchShape | None]) -> LockstepStep:
        """The forward of each rank's ``shapes`` (None: an idle rank), at least one of them busy."""
        busy = [s for s in shapes if s is not None]
        graph = self.graph(shapes)
        width = max(s.width for s in busy)
        decode = all(s.decode for s in busy)
        if graph:  # every rank, idle ones too, replays the graph of the largest batch
            pad = replayed_batch(max(s.seqs for s in busy), self.group_cost.cuda_graph_max_bs)
            rank_tokens = [pad * width] * len(shapes)
        else:
            rank_tokens = [s.tokens if s is not None else 0 for s in shapes]
        attention = max(self.rank_cost.split_gpu_time(0, BatchShape(
            tokens=t, seqs=s.seqs, kv_read_tokens=s.kv_read_tokens, attn_ctx=s.attn_ctx, decode=s.decode,
            width=s.width), padded=True)[0]
            for s, t in zip(shapes, rank_tokens, strict=True) if s is not None)
        seqs = sum(s.seqs for s in busy)
        gathered = BatchShape(tokens=sum(rank_tokens), seqs=seqs, kv_read_tokens=0, attn_ctx=0.0,
                              decode=decode, width=width)
        shared = self.group_cost.split_gpu_time(0, gathered, padded=True)[1]
        g = self.group_cost
        # vLLM replays a step that is no full-graph decode from its piecewise graphs where every rank's
        # tokens fit the largest captured size (the ranks agree on the padded size, as for a full graph)
        pieces = not graph and g.piecewise and max(rank_tokens) <= g.cuda_graph_max_bs
        comm = self._comm(max(rank_tokens), gathered, graph or pieces)
        dispatch = g.dispatch_time(0, graph, pieces) + self.sync_s
        work = attention + shared + comm
        total = g.forward_time(work, dispatch, graph, decode or pieces)
        return LockstepStep(attention, shared, comm, dispatch, graph, total)

    def _comm(self, rank_tokens: int, gathered: BatchShape, graph: bool) -> float:
        g, st = self.group_cost, self.group_cost.stages[0]
        gather = g.collective_time(gathered.tokens, graph)
        dense_layers = st.layers - st.moe_layers
        if self.layout.a2a != "none" and st.moe_layers:
            t = 2 * dense_layers * gather + st.moe_layers * self._a2a(rank_tokens, gathered.decode)
        else:
            t = 2 * st.layers * gather
        if self.layout.attn_tp > 1:  # each rank's attention output all-reduced over its own GPUs (and
            # its QK norm's sums where the norm spans the heads)
            t += st.layers * (self.rank_cost.collective_time(rank_tokens, graph)
                              + self.rank_cost.qk_norm_allreduce(rank_tokens, graph))
        return t + g.logits_gather_time(gathered.logit_rows)

    def _a2a(self, rank_tokens: int, decode: bool) -> float:
        """One MoE layer's dispatch and combine of a rank's tokens (split over its attention GPUs)."""
        per_gpu = max(1, -(-rank_tokens // self.layout.attn_tp))
        curve = self._deepep.get(self.layout.a2a_mode(decode))
        t = curve(per_gpu) if curve is not None else None
        if t is None:
            t = 2 * self.group_cost.a2a_time(per_gpu)
        return t * self.group_cost.p.scale_comm
