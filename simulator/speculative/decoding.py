"""One server's speculative decoding, put together at start-up: the resolved flags, the draft's cost
model and memory, the acceptance model and the iteration's price; and its running statistics, counted
the way SGLang counts them (``accept len`` and ``accept rate`` of each release, the verify count)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.costs import CostModel, CostParams, Parallel
from simulator.model_spec import ModelSpec
from simulator.speculative.acceptance import Acceptance, parse_acceptance
from simulator.speculative.drafts import draft_spec
from simulator.speculative.iteration import PARTS, IterationParts, SpecIteration
from simulator.speculative.params import SpecParams
from vocab.hardware import HardwareConf

# the draft kind whose published accept lengths ``auto`` reads, by SGLang algorithm
_KINDS = {"EAGLE3": "eagle3", "EAGLE": "eagle", "NEXTN": "mtp", "STANDALONE": "standalone", "NGRAM": "ngram"}


@dataclass
class SpecStats:
    """What SGLang accumulates between two decode log lines (and in total): request-verifies and the
    tokens they emitted."""

    verifies: int = 0  # request x verify steps
    tokens: int = 0  # tokens emitted by them, the target's own included
    total_verifies: int = 0
    total_tokens: int = 0
    calls: int = 0  # verify forwards (sglang:spec_verify_calls_total)
    # since start, request-verifies that kept at least i + 1 drafts, at index i (vLLM's per-position
    # acceptance, vllm:spec_decode_num_accepted_tokens_per_pos)
    accepted_at: list[int] = field(default_factory=list)
    # simulated GPU seconds of the iterations launched, by part (draft passes, verify, draft extend,
    # tree kernels): where speculation spends the GPU (parasweep_sim:spec_busy_seconds)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))

    def busy(self, parts: IterationParts) -> None:
        for name in PARTS:
            self.seconds[name] += getattr(parts, name)

    def add(self, requests: int, tokens: int) -> None:
        self.verifies += requests
        self.tokens += tokens
        self.total_verifies += requests
        self.total_tokens += tokens
        self.calls += 1

    def kept(self, drafts: int) -> None:
        """One request-verify kept ``drafts`` drafted tokens (its own token aside)."""
        grow = drafts - len(self.accepted_at)
        if grow > 0:
            self.accepted_at.extend([0] * grow)
        for i in range(drafts):
            self.accepted_at[i] += 1

    def interval(self) -> float:
        """The interval's accept length, then a new interval (0.0 when nothing was verified)."""
        length = self.tokens / self.verifies if self.verifies else 0.0
        self.verifies = self.tokens = 0
        return length

    @property
    def average(self) -> float:
        """Server-cumulative accept length (``/server_info``'s ``avg_spec_accept_length``)."""
        return self.total_tokens / self.total_verifies if self.total_verifies else 0.0


@dataclass(frozen=True)
class Draft:
    """The draft model as the server loads it: its numbers, its weights per GPU and how much it widens
    each KV cell (its KV shares the target's slots, one per target token)."""

    spec: ModelSpec | None  # None: n-gram drafting
    weight_bytes: float
    kv_cell_factor: float


@dataclass
class SpecDecoding:
    params: SpecParams
    acceptance: Acceptance
    iteration: SpecIteration
    draft: Draft

    def accept_sampler(self, seed: int) -> Callable[[], int]:
        """Draws one request's tokens from one verify from the acceptance model, reproducibly from
        ``seed`` (each DP replica draws its own)."""
        rng = random.Random(seed)
        sample = self.acceptance.sampler(self.params.max_accept_length - 1)
        return lambda: sample(rng.random())

    @property
    def kv_headroom(self) -> int:
        """KV slots SGLang holds back per running request for a step's drafts: twice the larger of the
        draft tree's tokens and the verify's (the second half absorbs the overlap scheduler's lag)."""
        p = self.params
        return 2 * max(p.num_steps * p.topk, p.num_draft_tokens)

    @property
    def expected_accept_length(self) -> float:
        return self.acceptance.expected_length(self.params.max_accept_length - 1)

    def accept_rate(self, length: float, release: tuple[int, ...] = (0, 5, 23)) -> float:
        """SGLang's ``accept rate`` for an interval's accept length: correct drafts over proposed ones,
        (length - 1) / (draft tokens - 1), from 0.5.10 on; 0.5.9 printed (length) / (draft tokens)."""
        n = self.params.num_draft_tokens
        if release < (0, 5, 10):
            return length / n if n else 0.0
        return (length - 1) / (n - 1) if n > 1 and length > 0 else 0.0


def load_draft(params: SpecParams, target: ModelSpec, hw: HardwareConf, par: Parallel,
               cost_params: CostParams, context_length: int) -> Draft:
    if params.draft_model_path is None:
        return Draft(None, 0.0, 1.0)
    draft = draft_spec(params.algorithm, params.draft_model_path, target, context_length)
    if params.algorithm != "STANDALONE":  # EAGLE heads and MTP layers use the target's embedding
        draft = dataclasses.replace(draft, embed_params=0)
    weight = CostModel(draft, hw, _draft_parallel(par), 1, True, cost_params).stages[0].weight_bytes
    return Draft(draft, weight, 1.0 + draft.num_layers / target.num_layers)


def _draft_parallel(par: Parallel) -> Parallel:
    """The draft runs on the target's TP (and EP) group, as one stage."""
    return Parallel(tp=par.tp, pp=1, ep=par.ep, moe_a2a_backend=par.moe_a2a_backend)


def build_spec_decoding(params: SpecParams, draft: Draft, target_cost: CostModel, acceptance: str,
                        price: Callable[[CostModel], object],
                        calibrated: Mapping[str, Mapping[str, Any]] | None = None) -> SpecDecoding:
    """The iteration priced on the server's own target cost model; ``price`` gives the draft's cost
    model the same step-cost source (measured tables or the roofline). ``calibrated``: a calibration
    profile's measured acceptance by draft kind, which ``auto`` takes before the published table."""
    kind = _KINDS[params.asked]
    depth = params.max_accept_length - 1
    measured = (calibrated or {}).get(kind)
    if measured is not None and acceptance.strip().startswith("auto"):
        acc = parse_acceptance(f"rates:{measured['value']}", kind, depth)
        if acc.forced_mean is None:  # SGLANG_SIMULATE_ACC_LEN still wins, as in SGLang
            acc = dataclasses.replace(acc, source=f"calibrated: per-position rate {measured['value']:g}, "
                                                  f"{measured.get('source', '')}")
    else:
        acc = parse_acceptance(acceptance, kind, depth)
    draft_cost = None
    if draft.spec is not None:
        draft_cost = CostModel(draft.spec, target_cost.hw, _draft_parallel(target_cost.par),
                               target_cost.cuda_graph_max_bs, target_cost.disable_cuda_graph, target_cost.p)
        price(draft_cost)
    return SpecDecoding(params, acc, SpecIteration(params, target_cost, draft_cost), draft)
