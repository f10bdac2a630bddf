"""What one speculative decode iteration costs, priced from the same step costs as any other step.

SGLang's EAGLE worker (0.5.23, ``eagle_worker_v2.py``) runs, for a decode batch of b requests:

1. the draft: ``num_steps - 1`` decode passes of the draft model over b x topk tokens (the first level's
   top-k comes from the previous iteration's draft extend; one step means no draft pass at all);
2. the verify: one target forward over b x draft_tokens tokens, each request's tree attending to its
   context, logits for every tree token;
3. the draft extend: one draft forward over b x draft_tokens tokens, which gives the next iteration's
   first top-k and hidden state;

plus the small kernels that pick each draft level's top-k and build, verify and accept the tree. Each of
the three forwards is replayed from its own CUDA graph where the batch fits the captured sizes, eager
otherwise. N-gram drafting has no draft model: its drafts come from a trie on the host, so its iteration
is the verify alone (and that host time).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import BatchShape, CostModel
from simulator.speculative.params import SpecParams, cuda_graph_batch_sizes

# GPU kernels besides the three forwards (docs/speculative.md, "The iteration"): per draft pass, the
# softmax, top-k and the gathers that grow the tree (4); per iteration, building the tree mask and
# positions, the verify's sampling and acceptance and the copy of accepted KV and hidden states (12).
# Each is tiny at decode batch sizes, so each costs the kernel floor.
KERNELS_PER_DRAFT_PASS = 4
KERNELS_PER_VERIFY = 12


def step_shape(context_lens: list[int] | tuple[int, ...], width: int) -> BatchShape:
    """A decode-mode forward of ``width`` new tokens per request, each request's KV read once and each
    new token attending over its context and the tokens before it in the step."""
    b = len(context_lens)
    ctx = sum(context_lens)
    return BatchShape(tokens=b * width, seqs=b, kv_read_tokens=ctx,
                      attn_ctx=float(width * ctx + b * width * (width + 1) / 2), decode=True, width=width)


PARTS = ("draft", "verify", "extend", "kernels")


@dataclass(frozen=True)
class IterationParts:
    """Seconds of one speculative iteration by part; ``total`` is their sum."""

    draft: float  # num_steps - 1 draft decode passes
    verify: float
    extend: float  # the draft extend
    kernels: float  # tree building, sampling, acceptance

    @property
    def total(self) -> float:
        return self.draft + self.verify + self.extend + self.kernels


class SpecIteration:
    """Prices a speculative iteration of a decode batch on one stage (pp = 1)."""

    def __init__(self, params: SpecParams, target: CostModel, draft: CostModel | None) -> None:
        self.params = params
        self.target = target
        self.draft = draft  # None: n-gram drafting
        self._floor = target.p.kernel_floor_us * 1e-6
        self.graph_sizes = cuda_graph_batch_sizes(target.graph_requests(params.num_draft_tokens))

    def padded(self, context_lens: list[int] | tuple[int, ...]) -> list[int]:
        """The batch a CUDA graph replays: padded up to the next captured size (the padding rows are
        computed and thrown away); eager batches as they are."""
        lens = list(context_lens)
        b = len(lens)
        if self.target.disable_cuda_graph or not lens or b > self.graph_sizes[-1]:
            return lens
        size = next(s for s in self.graph_sizes if s >= b)
        return lens + [lens[-1]] * (size - b)

    def verify_shape(self, context_lens: list[int] | tuple[int, ...]) -> BatchShape:
        return step_shape(context_lens, self.params.num_draft_tokens)

    def parts(self, context_lens: list[int] | tuple[int, ...]) -> IterationParts:
        p = self.params
        context_lens = self.padded(context_lens)
        verify = self.target.stage_time(0, self.verify_shape(context_lens))
        if self.draft is None:
            return IterationParts(0.0, verify, 0.0, KERNELS_PER_VERIFY * self._floor)
        passes = max(p.num_steps - 1, 0)
        draft = passes * self.draft.stage_time(0, step_shape(context_lens, p.topk)) if passes else 0.0
        extend = self.draft.stage_time(0, step_shape(context_lens, p.num_draft_tokens))
        kernels = (KERNELS_PER_DRAFT_PASS * passes + KERNELS_PER_VERIFY) * self._floor
        return IterationParts(draft, verify, extend, kernels)

    def drafter_parts(self, shape: BatchShape, drafting: list[int]) -> tuple[IterationParts, float]:
        """vLLM's drafter after a step that computed prompt tokens (``shape``), and its host dispatch: one
        draft pass over every token the step computed (the "extend"), then ``num_steps - 1`` passes of one
        token for each of the step's requests (``drafting``: their context lengths). N-gram: nothing."""
        if self.draft is None:
            return IterationParts(0.0, 0.0, 0.0, 0.0), 0.0
        passes = max(self.params.num_steps - 1, 0)
        extend = self.draft.stage_time(0, shape)
        draft = passes * self.draft.stage_time(0, step_shape(drafting, 1)) if passes and drafting else 0.0
        kernels = (KERNELS_PER_DRAFT_PASS * passes + KERNELS_PER_VERIFY) * self._floor
        host = self.draft.host_time(0, shape) * (1 + passes)
        return IterationParts(draft, 0.0, extend, kernels), host

    def host_time(self, context_lens: list[int] | tuple[int, ...]) -> float:
        """The host's dispatch of the iteration's forwards: a graph replay each (the draft passes are one
        graph), or every kernel of each when eager."""
        verify = self.verify_shape(context_lens)
        t = self.target.host_time(0, verify)
        if self.draft is not None:
            draft = self.draft.host_time(0, verify)
            passes = max(self.params.num_steps - 1, 0)
            t += draft * (1 + (passes if not self.target.uses_cuda_graph(verify) else min(passes, 1)))
        return t

    def time(self, context_lens: list[int] | tuple[int, ...]) -> float:
        return self.parts(context_lens).total

    def uses_cuda_graph(self, context_lens: list[int] | tuple[int, ...]) -> bool:
        return self.target.uses_cuda_graph(self.verify_shape(context_lens))
