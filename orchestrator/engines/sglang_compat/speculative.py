"""``spec.*`` -> SGLang's speculative-decoding flags for one release, and what that release refuses.

Each refusal mirrors an assertion or error of the release's own server-argument code, with its message
(recorded per release under "checks" in ``releases/sglang-<version>.json``), so a combination SGLang
would refuse on the GPU node is refused here, in one line, against the key the user can change.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.drafts import acceptance_flag, draft_model
from orchestrator.engines.sglang_compat.versions import Version, parse_version
from orchestrator.errors import ConfigError
from vocab.assets import model_dir
from vocab.model import read_config_json

# spec.algorithm -> --speculative-algorithm
ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "standalone": "STANDALONE",
              "ngram": "NGRAM"}
# The first release whose PP may run EAGLE speculation (with SGLANG_ENABLE_PP_SPEC=1); before it, PP refuses
# any speculation on GPUs, with a message that lost its "mixed chunked prefill" in 0.5.12 (read from each
# recorded release's checks)
PP_SPEC_SINCE: Version = (0, 5, 21)
_PP_REFUSAL = ((0, 5, 12),
               "Pipeline parallelism is not compatible with overlap schedule, speculative decoding")
_PP_REFUSAL_OLD = ("Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                   "mixed chunked prefill.")
# topk > 1 with pages of more than one token: the attention backends that build the per-branch tree
PAGED_TREE_BACKENDS_SINCE: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 5, 9), ("flashinfer", "fa3")), ((0, 5, 20), ("flashinfer", "fa3", "triton")))
VALID = ", ".join(["none", *ALGORITHMS])


def _extra(cfg: ParasweepConf, name: str) -> object:
    extra = {k.lstrip("-").replace("-", "_"): v for k, v in (cfg.server.extra_args or {}).items()}
    return extra.get(name)


def refuse_what_the_release_refuses(cfg: ParasweepConf, version: str) -> None:
    """The release's own refusals of this speculative configuration, with its message."""
    s, v = cfg.spec, parse_version(version)
    algo = ALGORITHMS[s.algorithm]
    if cfg.pp.size > 1:
        if v < PP_SPEC_SINCE:
            since, message = _PP_REFUSAL
            raise ConfigError("spec.algorithm", s.algorithm,
                              f"none with pp.size={cfg.pp.size} on SGLang {version}",
                              f"SGLang: {message if v >= since else _PP_REFUSAL_OLD}")
        if algo not in ("EAGLE", "NEXTN"):
            raise ConfigError("spec.algorithm", s.algorithm, f"eagle or mtp with pp.size={cfg.pp.size}",
                              "SGLang: Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                              "speculative decoding")
        raise ConfigError("pp.size", cfg.pp.size, "1 with speculative decoding",
                          "SGLang: PP + speculative decoding (MTP) is only supported on prefill nodes "
                          "(disaggregation-mode=prefill), unless SGLANG_ENABLE_PP_SPEC=1, which parasweep "
                          "does not set")
    if cfg.dp.attention > 1 and algo in ("STANDALONE", "NGRAM"):
        word = "standalone" if algo == "STANDALONE" else "ngram"
        raise ConfigError("spec.algorithm", s.algorithm, "eagle, eagle3 or mtp with attention DP",
                          f"SGLang: Currently {word} speculative decoding does not support dp attention.")
    topk = s.topk if algo != "NGRAM" else 10
    backend = _extra(cfg, "attention_backend")
    if topk is not None and topk > 1 and backend == "trtllm_mha":
        raise ConfigError("spec.topk", s.topk, "1 with the trtllm_mha attention backend",
                          "SGLang: trtllm_mha backend only supports topk = 1 for speculative decoding.")
    page = _extra(cfg, "page_size")
    if topk is not None and topk > 1 and page is not None and int(str(page)) > 1 and backend is not None:
        allowed = next(b for since, b in reversed(PAGED_TREE_BACKENDS_SINCE) if v >= since)
        if algo == "NGRAM":
            allowed = ("flashinfer",)
        if backend not in allowed:
            raise ConfigError("spec.topk", s.topk, f"1, or an attention backend of {', '.join(allowed)}",
                              f"SGLang {version} refuses speculative_eagle_topk > 1 with page_size > 1 on "
                              f"{backend}")


def spec_flags(cfg: ParasweepConf, version: str) -> list[tuple[str, list[str], str, object]]:
    """(flag, values, config key, value) of the trial's speculative decoding; none when spec.algorithm is
    none."""
    s = cfg.spec
    if s.algorithm == "none":
        for key in ("num_steps", "topk", "num_draft_tokens", "draft_model"):
            if getattr(s, key) is not None:
                raise ConfigError(f"spec.{key}", getattr(s, key), "null while spec.algorithm=none",
                                  "it only applies with speculative decoding (spec=eagle3, mtp, ...)")
        return []
    if s.algorithm not in ALGORITHMS:
        raise ConfigError("spec.algorithm", s.algorithm, VALID)
    for key in ("num_steps", "topk", "num_draft_tokens"):
        value = getattr(s, key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"spec.{key}", value, "a positive integer, or null for SGLang's own choice")
    partial = s.topk is not None or s.num_draft_tokens is not None
    if s.num_steps is None and partial and s.algorithm != "ngram":
        raise ConfigError("spec.num_steps", None, "a number of steps when spec.topk or spec.num_draft_tokens "
                          "is set", "SGLang chooses all three together or none")
    refuse_what_the_release_refuses(cfg, version)
    flags: list[tuple[str, list[str], str, object]] = [
        ("--speculative-algorithm", [ALGORITHMS[s.algorithm]], "spec.algorithm", s.algorithm)]
    draft = draft_model(cfg)
    if draft is not None:
        flags.append(("--speculative-draft-model-path", [str(model_dir(draft))], "spec.draft_model", draft))
    for key, flag in (("num_steps", "--speculative-num-steps"), ("topk", "--speculative-eagle-topk"),
                      ("num_draft_tokens", "--speculative-num-draft-tokens")):
        value = getattr(s, key)
        if value is not None:
            flags.append((flag, [str(value)], f"spec.{key}", value))
    if s.draft_load_format is not None:
        flags.append(("--speculative-draft-load-format", [s.draft_load_format], "spec.draft_load_format",
                      s.draft_load_format))
    return flags


def simulated_acceptance_env(cfg: ParasweepConf, engine: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``SGLANG_SIMULATE_ACC_LEN`` for real SGLang whose draft has dummy weights: a random draft is almost
    never accepted, so the measured iteration would price speculation at an accept length of 1. SGLang's
    own override makes the verify accept the mean the acceptance model gives (spec.acceptance on the
    workload's text, at the draft depth SGLang resolves), so the measurement prices the iteration at the
    accept length the trial assumes. Nothing where the user set the variable, the draft has real weights,
    or there is no draft model (n-gram)."""
    from simulator.speculative.acceptance import parse_acceptance
    from simulator.speculative.params import auto_params

    s = cfg.spec
    if engine != "sglang" or s.algorithm in ("none", "ngram") or "SGLANG_SIMULATE_ACC_LEN" in environ:
        return {}
    if (s.draft_load_format or cfg.model.load_format) != "dummy":
        return {}
    config = read_config_json(model_dir(cfg.model.path))
    arch = (config.get("architectures") or ["?"])[0]
    steps, _, tokens = auto_params(ALGORITHMS[s.algorithm], arch)
    if s.num_steps is not None:
        steps, tokens = s.num_steps, s.num_draft_tokens or s.num_steps + 1
    depth = min(steps, tokens - 1)
    kind = {"mtp": "mtp"}.get(s.algorithm, s.algorithm)
    acceptance = parse_acceptance(acceptance_flag(cfg), kind, depth)
    return {"SGLANG_SIMULATE_ACC_LEN": f"{acceptance.expected_length(depth):.3f}"}
