"""SGLang's speculative-decoding flags, resolved the way SGLang 0.5.23 resolves them at start-up.

What the simulated engine needs, and what parasweep's launcher and prediction need to know about a
configuration before anything runs: the algorithm's canonical name, the draft's steps, top-k and draft
tokens (SGLang's automatic choice per model architecture where none is given), and the settings
speculation changes on its own (the running-request cap of 48, the CUDA-graph batch sizes). Every
constant here was read from the 0.5.23 wheel's ``srt/arg_groups/speculative_hook.py`` and
``cuda_graph_hook.py``; the per-release differences parasweep launches are in
``orchestrator/engines/sglang_compat/speculative.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

# --speculative-algorithm values the model covers, as SGLang upper-cases them; NEXTN (a model's own MTP
# layers) runs as EAGLE
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
# what an unset --max-running-requests becomes with any of them ("Max running requests is reset to 48
# for speculative decoding.")
SPEC_MAX_RUNNING_REQUESTS = 48
# NGRAM: top-k is the trie's widest breadth (--speculative-ngram-max-bfs-breadth, default 10) and the draft
# tokens default to 12
NGRAM_MAX_BFS_BREADTH = 10
NGRAM_DRAFT_TOKENS = 12

# _auto_choose_speculative_params: (num_steps, eagle_topk, num_draft_tokens) when num_steps is unset
_WIDE_TREE = (5, 4, 8)
_CHAIN = (3, 1, 4)
_WIDE_TREE_ARCHS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
# architectures whose MTP layers ship in the target's own checkpoint: the draft path defaults to the
# target's (the ones parasweep ships models of)
BUILT_IN_MTP_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Glm4MoeForCausalLM")


class SpecFlagError(ValueError):
    """A speculative-decoding flag SGLang would refuse; the message is SGLang's own, on one line."""


def auto_params(algorithm: str, architecture: str) -> tuple[int, int, int]:
    """SGLang's own (steps, topk, draft tokens) for an EAGLE-family algorithm and target architecture."""
    if algorithm == "STANDALONE":
        return _CHAIN
    return _WIDE_TREE if architecture in _WIDE_TREE_ARCHS else _CHAIN


def cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang captures when speculation is on: 1-8 by 1, 10-32 by 2, 40-64 by 4,
    72-256 by 8, then by 16, up to ``max_bs`` (with ``max_bs`` itself last when it falls between)."""
    sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
             *range(272, max(max_bs, 272) + 1, 16)]
    kept = [b for b in sizes if b <= max_bs]
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)
    return kept


@dataclass(frozen=True)
class SpecParams:
    """One server's speculative decoding, resolved: what each decode iteration does."""

    algorithm: str  # EAGLE, EAGLE3, STANDALONE or NGRAM (NEXTN resolved to EAGLE)
    asked: str  # the algorithm as given (NEXTN stays NEXTN here, for the records)
    num_steps: int  # k: draft depth (k - 1 draft decode passes)
    topk: int  # K: branches per draft step
    num_draft_tokens: int  # N: tree tokens the target verifies per request
    draft_model_path: str | None  # None for NGRAM
    warnings: tuple[str, ...] = ()

    @property
    def max_accept_length(self) -> int:
        """Most tokens one verify can emit per request: the accepted drafts along the deepest path, plus
        the target's own token."""
        return min(self.num_steps, self.num_draft_tokens - 1) + 1

    def describe(self) -> str:
        name = "MTP (NEXTN)" if self.asked == "NEXTN" else self.algorithm
        return f"{name} steps={self.num_steps} topk={self.topk} draft_tokens={self.num_draft_tokens}"


def resolve_spec(algorithm: str | None, *, architecture: str, model_path: str, draft_model_path: str | None,
                 num_steps: int | None, topk: int | None, draft_tokens: int | None,
                 page_size: int, attention_backend: str, attn_dp: bool, pp_size: int,
                 pp_spec_enabled: bool) -> SpecParams | None:
    """SGLang 0.5.23's resolution of the speculative flags (None: no speculation). Raises
    :class:`SpecFlagError` with SGLang's own message where it refuses the combination."""
    if algorithm is None:
        return None
    asked = algorithm.upper()
    if asked not in ALGORITHMS:
        raise SpecFlagError(f"--speculative-algorithm {algorithm}: the simulated engine models "
                            f"{', '.join(ALGORITHMS)}")
    algo = "EAGLE" if asked == "NEXTN" else asked
    warnings: list[str] = []
    if pp_size > 1:
        if algo != "EAGLE":
            raise SpecFlagError("Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                                "speculative decoding")
        if not pp_spec_enabled:
            raise SpecFlagError("PP + speculative decoding (MTP) is only supported on prefill nodes "
                                "(disaggregation-mode=prefill)")
    if algo == "NGRAM":
        if attn_dp:
            raise SpecFlagError("Currently ngram speculative decoding does not support dp attention.")
        k_top = NGRAM_MAX_BFS_BREADTH
        n = draft_tokens if draft_tokens is not None else NGRAM_DRAFT_TOKENS
        steps = num_steps if num_steps is not None else n // k_top
        if k_top > 1 and page_size > 1 and attention_backend != "flashinfer":
            raise SpecFlagError(
                f"speculative_eagle_topk({k_top}) > 1 with page_size({page_size}) > 1 is unstable "
                "and produces incorrect results for paged attention backends. This combination is only "
                "supported for the 'flashinfer' backend.")
        return SpecParams(algo, asked, steps, k_top, n, None, tuple(warnings))
    if algo == "STANDALONE" and attn_dp:
        raise SpecFlagError("Currently standalone speculative decoding does not support dp attention.")
    draft = draft_model_path
    if draft is None and architecture in BUILT_IN_MTP_ARCHS:
        draft = model_path
    if draft is None:
        raise SpecFlagError(f"--speculative-algorithm {asked} needs --speculative-draft-model-path "
                            f"({architecture} carries no draft layers of its own)")
    if num_steps is None:
        if topk is not None or draft_tokens is not None:
            raise SpecFlagError("speculative_eagle_topk and speculative_num_draft_tokens need "
                                "speculative_num_steps (SGLang asserts all three are unset together)")
        num_steps, topk, draft_tokens = auto_params(algo, architecture)
    topk = 1 if topk is None else topk
    if draft_tokens is None:
        draft_tokens = num_steps + 1
    if topk == 1 and draft_tokens != num_steps + 1:
        warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                        "speculative_eagle_topk == 1")
        draft_tokens = num_steps + 1
    if num_steps < 1 or topk < 1 or draft_tokens < 2:
        raise SpecFlagError(f"speculative steps {num_steps}, topk {topk}, draft tokens {draft_tokens}: "
                            "each must be >= 1 (draft tokens >= 2)")
    if attention_backend == "trtllm_mha" and topk > 1:
        raise SpecFlagError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    backends = ("flashinfer", "fa3", "triton")
    if topk > 1 and page_size > 1 and attention_backend not in backends:
        raise SpecFlagError(
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {backends}; got "
            f"attention_backend={attention_backend!r}. Use page_size == 1 or one of those backends.")
    return SpecParams(algo, asked, num_steps, topk, draft_tokens, draft, tuple(warnings))
