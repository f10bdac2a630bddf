"""``spec.*`` -> vLLM's ``--speculative-config`` (one JSON object), and what each recorded release refuses.

The shared keys mean the same on both engines: ``spec.algorithm`` the kind of draft, ``spec.num_steps``
the draft's depth, the draft's config folder from ``spec.draft_model`` or the model's own. vLLM drafts a
chain: ``num_speculative_tokens`` = ``spec.num_steps`` tokens per request per step, verified with the
request's own next token, so ``spec.topk`` can only be 1 and ``spec.num_draft_tokens`` only
``spec.num_steps + 1``; and vLLM has no depth of its own to choose, so ``spec.num_steps`` is required. The
method must be one the release accepts (``speculative_methods``, read from its wheel); the release's own
refusals are kept with its words (docs/vllm-adapter.md, "Speculative decoding").
"""

from __future__ import annotations

import json

from packaging.version import Version

from orchestrator.config.schema import ParasweepConf
from orchestrator.engines.drafts import acceptance_flag, draft_model
from orchestrator.engines.launch_args import Arg
from orchestrator.engines.vllm_compat.versions import VLLMRelease
from orchestrator.errors import ConfigError
from vocab.assets import model_dir

# spec.algorithm -> vLLM's method (a whole smaller model drafting is vLLM's draft_model)
METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram", "standalone": "draft_model"}
FLAG = "--speculative-config"
DRAFT_MODEL_SINCE = Version("0.15")  # 0.11 and 0.12 refuse a draft model
SYNTHETIC_SINCE = Version("0.34")  # the default runner's rejection sampler takes given rates from here
_NO_DRAFT_MODEL = ("Draft model speculative decoding is not supported yet. Please consider using other "
                   "speculative decoding methods such as ngram, medusa, eagle, or mtp.")


def spec_args(cfg: ParasweepConf, version: str) -> list[Arg]:
    """The trial's ``--speculative-config`` for vLLM ``version``; none where spec.algorithm is none."""
    s = cfg.spec
    if s.algorithm == "none":
        return []
    if s.algorithm not in METHODS:
        raise ConfigError("spec.algorithm", s.algorithm, "none, " + ", ".join(METHODS))
    k = s.num_steps
    if k is None:
        raise ConfigError("spec.num_steps", None, "a positive integer with engine=vllm",
                          why="vLLM's --speculative-config needs num_speculative_tokens: it has no depth "
                              "of its own to choose")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError("spec.num_steps", k, "a positive integer")
    if s.topk not in (None, 1):
        raise ConfigError("spec.topk", s.topk, "1 or null with engine=vllm",
                          why="vLLM drafts a chain, one token per draft step")
    if s.num_draft_tokens not in (None, k + 1):
        raise ConfigError("spec.num_draft_tokens", s.num_draft_tokens,
                          f"null or spec.num_steps + 1 = {k + 1} with engine=vllm",
                          why="vLLM verifies the drafts and the request's own next token")
    if s.draft_load_format not in (None, cfg.model.load_format):
        raise ConfigError("spec.draft_load_format", s.draft_load_format,
                          f"null or {cfg.model.load_format} (model.load_format) with engine=vllm",
                          why="vLLM loads the draft as it loads the target (--load-format)")
    conf: dict[str, object] = {"method": METHODS[s.algorithm], "num_speculative_tokens": k}
    draft = draft_model(cfg)
    if draft is not None:
        conf["model"] = str(model_dir(draft))
    conf.update(synthetic_acceptance(cfg, version))
    return [Arg(FLAG, [json.dumps(conf, sort_keys=True)], "spec.algorithm", s.algorithm)]


def synthetic_acceptance(cfg: ParasweepConf, version: str) -> dict[str, object]:
    """A draft with random weights (``load_format: dummy``) is almost never accepted, so a measured trial
    would price speculation at an accept length of 1. From 0.34 vLLM's rejection sampler can accept by
    given per-position rates instead (``rejection_sample_method: synthetic``): the rates the acceptance
    model gives (``spec.acceptance`` on the workload's text, at the trial's depth), so the measurement
    prices the step at the acceptance the trial assumes, as ``SGLANG_SIMULATE_ACC_LEN`` does on SGLang.
    Nothing before 0.34 (its default runner does not read it: the plan says so), with real weights, or
    for n-gram drafts (no draft model: the prompt's own text decides)."""
    from simulator.speculative.acceptance import parse_acceptance

    s = cfg.spec
    dummy = (s.draft_load_format or cfg.model.load_format) == "dummy"
    if not dummy or s.algorithm == "ngram" or Version(version) < SYNTHETIC_SINCE or s.num_steps is None:
        return {}
    kind = "mtp" if s.algorithm == "mtp" else s.algorithm
    rates = parse_acceptance(acceptance_flag(cfg), kind, s.num_steps).survival(s.num_steps)
    return {"rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [round(r, 4) for r in rates]}


def check_spec(arg: Arg, args: list[Arg], rel: VLLMRelease) -> None:
    """The release's refusals of the speculative configuration ``arg``: a method it lacks, a draft model
    before 0.15, asynchronous scheduling asked for with a method it does not run (``args``: the command's
    other flags)."""
    from simulator.vllm.releases import played
    from simulator.vllm.speculative import SpecConfigError, async_with_spec

    method = json.loads(arg.values[0])["method"]
    if method not in rel.speculative_methods:
        offered = [a for a, m in METHODS.items() if m in rel.speculative_methods]
        raise ConfigError(arg.key, arg.value, ", ".join(["none", *offered]) + f" on vLLM {rel.version}",
                          why=f"vLLM {rel.version} has no speculative method {method!r} ({rel.source})")
    if method == "draft_model" and Version(rel.version) < DRAFT_MODEL_SINCE:
        raise ConfigError(arg.key, arg.value, f"eagle, eagle3, mtp or ngram on vLLM {rel.version}",
                          why=f"vLLM {rel.version}: {_NO_DRAFT_MODEL}")
    asked = next((a.value for a in args if a.key == "vllm.async_scheduling"), None)
    try:
        async_with_spec(rel.version, method, asked if isinstance(asked, bool) else None,
                        played(rel.version).async_scheduling_default)
    except SpecConfigError as e:
        raise ConfigError("vllm.async_scheduling", asked, f"false or null with spec.algorithm={arg.value}",
                          why=f"vLLM {rel.version}: {e}") from None
