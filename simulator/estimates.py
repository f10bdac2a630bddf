"""Analytic estimates from the cost model, for the diagnosis: how long one decode step takes at a
given batch, how much of it is TP/EP communication, and its memory-bound floor.

These are the model's numbers (not measurements); callers say so where a person reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import BatchShape, decode_shape, distinct_experts, ep_imbalance, prefill_shape
from simulator.sim_config import SimConfig


@dataclass(frozen=True)
class DecodeStep:
    batch: int
    step_s: float  # one micro-batch's decode trip through every stage (the step itself when pp=1,
    #                with the overlap scheduler's host work beside it)
    comm_s: float  # of which TP/EP collectives, all stages
    memory_bound_s: float  # the same trip if it only read weights and KV at the full memory bandwidth
    # speculative decoding (0.0 when off): one draft-verify-extend iteration, its verify alone, and the
    # tokens the model expects it to emit per request; step_s stays the plain step it replaces
    spec_step_s: float = 0.0
    verify_s: float = 0.0
    spec_tokens: float = 0.0


def trip(cfg: SimConfig, shape: BatchShape) -> float:
    """One micro-batch's trip (the step with its host work, ``CostModel.ring_trip``); with attention DP,
    the lockstep forward of every rank running ``shape`` (``simulator/lockstep.py``)."""
    overlap = cfg.pp == 1 and not cfg.disable_overlap_schedule
    if cfg.lockstep is None:
        return cfg.cost.ring_trip(shape, overlap)
    step = cfg.lockstep.step([shape] * cfg.attn_dp)
    host = cfg.cost.sched_time(shape.seqs) + step.dispatch
    return max(step.total, host) if overlap else step.total + host


def decode_step(cfg: SimConfig, batch: int, context_len: int) -> DecodeStep:
    """One decode step of ``batch`` requests whose contexts are ``context_len`` tokens long (each
    attention-DP rank's batch, with attention DP)."""
    cost, spec, par = cfg.cost, cfg.spec, cfg.par
    shape = decode_shape([max(1, context_len)] * max(1, batch))
    ranks = cfg.attn_dp
    comm = (cfg.lockstep.step([shape] * ranks).comm if cfg.lockstep is not None
            else sum(cost.comm_time(s, shape) for s in range(par.pp)))
    bandwidth = cfg.hw.mem_bw_gbs * 1e9
    floor = 0.0
    for st in cost.stages:  # with attention DP a GPU reads its rank's KV; the experts see every rank's tokens
        nbytes = st.nonexpert_bytes + shape.kv_read_tokens * st.kv_bytes_per_token
        if st.moe_layers:
            touched = distinct_experts(spec.num_experts, spec.top_k, shape.tokens * ranks)
            imbalance = ep_imbalance(spec.num_experts, par.ep, touched)
            nbytes += st.moe_layers * touched * spec.expert_bytes * imbalance / par.tp
        floor += nbytes / bandwidth
    step = trip(cfg, shape)
    sd = cfg.speculative
    if sd is None:
        return DecodeStep(batch, step, comm, floor)
    lens = [max(1, context_len)] * max(1, batch)
    parts = sd.iteration.parts(lens)
    return DecodeStep(batch, step, comm, floor, parts.total, parts.verify, sd.expected_accept_length)


def static_prefill_s(cfg: SimConfig, batch: int, prompt_len: int) -> float:
    """One forward that prefills ``batch`` prompts of ``prompt_len`` tokens at once, through every stage,
    with nothing queued before it (a static batch: what offline estimators price as TTFT)."""
    shape = prefill_shape([(max(1, prompt_len), 0)] * max(1, batch))
    return cfg.cost.ring_trip(shape, cfg.par.pp == 1 and not cfg.disable_overlap_schedule)


@dataclass(frozen=True)
class DecodeCeiling:
    """What the cost model says no closed-loop load can beat, for a search that prunes.

    ``tok_s``: decoded tokens per second of the whole engine (all DP replicas) that no load of at most
    ``max_concurrency`` requests exceeds, within the ITL bound when one is given. A bound, not an
    estimate: every step is priced at the shortest context, with no prefill, no queueing and no host
    stall, and a micro-batch's tokens come at most once per trip of it through every stage.
    ``concurrency``: the highest load whose steady micro-batches keep a trip within the ITL bound
    (None without one): a starting point for a search of the load, not a bound."""

    tok_s: float
    concurrency: int | None


def decode_ceiling(cfg: SimConfig, context_len: int, max_concurrency: int,
                   itl_bound_s: float | None = None, itl_share: float = 1.0) -> DecodeCeiling:
    """The ceiling of ``cfg`` for requests of at least ``context_len`` tokens of context. With
    ``itl_bound_s``, at least ``itl_share`` of all inter-token gaps are within it (0.99 for a p99
    bound), so that share of the tokens comes from micro-batches whose trip fits the bound."""
    cost, pp = cfg.cost, cfg.pp
    slots = pp + (cfg.depth if pp > 1 else 0)
    # the schedulers the load is spread over: DP replicas, or attention-DP ranks (in lockstep: one trip
    # of every rank at its share prices them all)
    per_replica = max(1, -(-max_concurrency // cfg.schedulers))
    top = max(1, min(per_replica, cfg.pp_max_micro_batch_size, cfg.max_running_requests))

    def shape(b: int) -> BatchShape:
        return decode_shape([max(1, context_len)] * b)

    def trip_of(b: int) -> float:
        return trip(cfg, shape(b))

    guess = None
    gap = cfg.speculative.params.max_accept_length if cfg.speculative is not None else 1
    if itl_bound_s is not None:
        itl_bound_s *= gap  # a speculative iteration's tokens share its time: bound the trip, not each gap
        if trip_of(1) > itl_bound_s:  # even one request alone misses the bound on every token
            return DecodeCeiling(0.0, 0)
        lo, hi = 1, top  # the largest micro-batch whose trip fits: a trip grows with the batch
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if trip_of(mid) <= itl_bound_s:
                lo = mid
            else:
                hi = mid - 1
        top = lo
        guess = cfg.schedulers * min(per_replica, slots * top)
    # b / trip(b) grows with b within each regime (CUDA graph, eager): its maximum is at the largest
    # batch of a regime; the powers of two are there as a margin for a cost table's kinks
    batches = {top, min(top, cfg.cuda_graph_max_bs_decode), *(1 << k for k in range(top.bit_length()))}
    batches = {b for b in batches if 1 <= b <= top}
    # speculation emits at most its deepest path's tokens per request per iteration, and an iteration takes
    # at least a plain step: a bound still, for a prune
    gain = cfg.speculative.params.max_accept_length if cfg.speculative is not None else 1
    by_trip = gain * max(b / trip_of(b) for b in batches)
    rate = min(slots * by_trip, gain * per_replica / trip_of(1))
    if pp > 1:  # each stage runs one micro-batch at a time
        rate = min(rate, min(max(b / cost.stage_time(s, shape(b)) for b in batches) for s in range(pp)))
    return DecodeCeiling(cfg.schedulers * rate / itl_share, guess)
