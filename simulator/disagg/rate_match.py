"""A static rate match of a disaggregated deployment, priced as offline estimators price one (NVIDIA's
AIConfigurator, for one): each role alone at a fixed batch, no queue, no KV transfer, and the deployment
as the smaller of the two roles' rates, each derated by a constant.

* **Prefill.** A server runs static batches of ``b`` whole prompts in one forward; its rate is
  ``b / t(b)`` sequences per second at the ``b`` with the highest rate whose TTFT, the forward's time
  times a correction of 1.8 for queueing, meets the TTFT bound.
* **Decode.** A server runs ``b`` requests at a context of the prompt plus half the output; its rate is
  ``b / (steps of the output x the step's time)`` at the largest ``b`` whose step meets the ITL bound,
  within its KV pool and its running-request cap.
* **The deployment.** ``min(P x prefill rate x 0.9, D x decode rate x 0.92)`` sequences per second, times
  the output length for tokens per second.

It is a first-order check beside the discrete-event prediction, not a queueing model: nothing waits for
a server, a transfer or a pre-allocation, requests arrive exactly as fast as they leave, and a bound on a
percentile is held by a mean. The step times are the simulator's cost model, the same the prediction uses,
so the two differ only in how they compose them.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.estimates import decode_step, static_prefill_s
from simulator.sim_config import SimConfig

PREFILL_DERATE = 0.9  # the prefill side's constant derate in the rate match
DECODE_DERATE = 0.92  # the decode side's
TTFT_CORRECTION = 1.8  # a static prefill's time times this stands for the TTFT under load
MAX_PREFILL_BATCH = 64  # static prefill batches tried: 1, 2, 4, ... up to this


@dataclass(frozen=True)
class RateMatch:
    prefill_batch: int  # prompts per static forward (0: none meets the TTFT bound)
    prefill_s: float  # that forward's time
    prefill_seq_s: float  # sequences per second of one prefill server
    decode_batch: int  # requests per decode step (0: none meets the ITL bound)
    decode_step_s: float
    decode_seq_s: float  # sequences per second of one decode server
    seq_s: float  # the deployment's, after both derates
    output_tok_s: float
    bound_by: str  # "prefill" or "decode": the smaller side

    @property
    def ttft_s(self) -> float:
        """The TTFT the rate match assumes: the static forward's time, corrected."""
        return TTFT_CORRECTION * self.prefill_s


def _batches(top: int) -> list[int]:
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    return out if top in out else [*out, top]


def rate_match(prefill: SimConfig, decode: SimConfig, prefill_workers: int, decode_workers: int,
               input_len: int, output_len: int, ttft_bound_s: float, itl_bound_s: float) -> RateMatch:
    """The static rate match of ``prefill_workers`` servers configured as ``prefill`` and
    ``decode_workers`` configured as ``decode`` (module docstring)."""
    pre_b, pre_s, pre_rate = 0, 0.0, 0.0
    for b in _batches(MAX_PREFILL_BATCH):
        t = static_prefill_s(prefill, b, input_len)
        if TTFT_CORRECTION * t <= ttft_bound_s and b / t > pre_rate:
            pre_b, pre_s, pre_rate = b, t, b / t
    context = input_len + output_len // 2
    room = max(1, decode.max_total_num_tokens // max(1, input_len + output_len))
    top = max(1, min(decode.max_running_requests, room))
    dec_b, dec_s, dec_rate = 0, 0.0, 0.0
    for b in _batches(top):
        step = decode_step(decode, b, context).step_s
        if step <= itl_bound_s:
            dec_b, dec_s, dec_rate = b, step, b / (max(1, output_len - 1) * step)
    prefill_side = prefill_workers * pre_rate * PREFILL_DERATE
    decode_side = decode_workers * dec_rate * DECODE_DERATE
    seq_s = min(prefill_side, decode_side)
    return RateMatch(pre_b, pre_s, pre_rate, dec_b, dec_s, dec_rate, seq_s, seq_s * output_len,
                     "prefill" if prefill_side <= decode_side else "decode")
