"""Analytic estimates from the cost model, for the diagnosis: how long one decode step takes at a
given batch, how much of it is TP/EP communication, and its memory-bound floor.

These are the model's numbers (not measurements); callers say so where a person reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import decode_shape, distinct_experts, ep_imbalance, prefill_shape
from simulator.sim_config import SimConfig


@dataclass(frozen=True)
class DecodeStep:
    batch: int
    step_s: float  # one micro-batch's decode trip through every stage (the step itself when pp=1,
    #                with the overlap scheduler's host work beside it)
    comm_s: float  # of which TP/EP collectives, all stages
    memory_bound_s: float  # the same trip if it only read weights and KV at the full memory bandwidth


def decode_step(cfg: SimConfig, batch: int, context_len: int) -> DecodeStep:
    """One decode step of ``batch`` requests whose contexts are ``context_len`` tokens long."""
    cost, spec, par = cfg.cost, cfg.spec, cfg.par
    shape = decode_shape([max(1, context_len)] * max(1, batch))
    comm = sum(cost.comm_time(s, shape) for s in range(par.pp))
    bandwidth = cfg.hw.mem_bw_gbs * 1e9
    floor = 0.0
    for st in cost.stages:
        nbytes = st.nonexpert_bytes + shape.kv_read_tokens * st.kv_bytes_per_token
        if st.moe_layers:
            touched = distinct_experts(spec.num_experts, spec.top_k, shape.tokens)
            imbalance = ep_imbalance(spec.num_experts, par.ep, touched)
            nbytes += st.moe_layers * touched * spec.expert_bytes * imbalance / par.tp
        floor += nbytes / bandwidth
    overlap = par.pp == 1 and not cfg.disable_overlap_schedule
    return DecodeStep(batch, cost.ring_trip(shape, overlap), comm, floor)


def static_prefill_s(cfg: SimConfig, batch: int, prompt_len: int) -> float:
    """One forward that prefills ``batch`` prompts of ``prompt_len`` tokens at once, through every stage,
    with nothing queued before it (a static batch: what offline estimators price as TTFT)."""
    shape = prefill_shape([(max(1, prompt_len), 0)] * max(1, batch))
    return cfg.cost.ring_trip(shape, cfg.par.pp == 1 and not cfg.disable_overlap_schedule)
