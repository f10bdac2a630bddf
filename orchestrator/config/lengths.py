"""How long a workload's requests may get: the bounds its length distributions are clipped at, so that
every request fits the model's context."""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from vocab.load import LengthDist

# an unbounded output distribution (normal, exponential, lognormal) is clipped at this many times its
# mean: a long tail, but a bounded one
OUTPUT_TAIL = 4


def length_bounds(cfg: ParasweepConf, context: int | None) -> tuple[int | None, int | None]:
    """(input_max_len, output_max_len) for the workload's length distributions: an output is at most
    its distribution's bound (``OUTPUT_TAIL`` x its mean when unbounded), and an input leaves room for
    the longest output in the model's context. (None, None) for fixed lengths."""
    w = cfg.workload
    if w.input_dist == "fixed" and w.output_dist == "fixed":
        return None, None
    out = LengthDist.parse(w.output_dist, w.output_len).upper or OUTPUT_TAIL * w.output_len
    if context:
        out = min(out, context - 1)
    return (context - out - 1 if context else None), out
