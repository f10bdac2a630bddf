"""What speculative decoding needs whichever engine runs it: the draft's config folder (``spec.draft_model``,
the model's own draft for the algorithm, or none: n-gram, a model's own MTP layers) and the acceptance the
simulated engine and predictions assume (``spec.acceptance`` as ``--sim-spec-acceptance``). The engines'
own flags are built in ``sglang_compat/speculative.py`` and ``vllm_compat/speculative.py``."""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError
from vocab.assets import model_dir
from vocab.model import ModelConfigError, mtp_layers, read_config_json


def has_mtp_layers(cfg: ParasweepConf) -> bool:
    """Whether the model's config.json carries next-token prediction layers (num_nextn_predict_layers)."""
    try:
        config = read_config_json(model_dir(cfg.model.path))
    except ModelConfigError:
        return False
    return mtp_layers(config) > 0


def draft_model(cfg: ParasweepConf) -> str | None:
    """The draft's config folder: spec.draft_model, else the model's own draft for the algorithm
    (model.drafts); None where the engine needs none (n-gram, a model's own MTP layers)."""
    s = cfg.spec
    if s.draft_model:
        return s.draft_model
    if s.algorithm == "ngram":
        return None
    if s.algorithm == "mtp":
        if not has_mtp_layers(cfg):
            raise ConfigError("spec.algorithm", s.algorithm, "eagle3 with a draft head, or a model with MTP "
                              "layers", f"{cfg.model.name}'s config.json has no num_nextn_predict_layers")
        return None
    drafts = dict(cfg.model.drafts or {})
    if s.algorithm not in drafts:
        known = ", ".join(f"{k}: {v}" for k, v in drafts.items()) or "none"
        raise ConfigError("spec.draft_model", None, f"a draft's config folder for {s.algorithm}",
                          f"{cfg.model.name} ships no {s.algorithm} draft (model.drafts has {known})")
    return drafts[s.algorithm]


# the kind of text each workload source carries, for spec.acceptance=auto (published accept lengths are
# per kind of text); token-id sources have no text, and chat, the lowest, stands in for them
_TRAFFIC = {"sharegpt": "chat", "mooncake": "chat", "azure": "chat"}


def acceptance_flag(cfg: ParasweepConf) -> str:
    """``spec.acceptance`` as the simulator's ``--sim-spec-acceptance``: auto:<kind of text>, a mean accept
    length, or rates:p1,p2,..."""
    value = cfg.spec.acceptance
    if isinstance(value, str) and value.strip() == "auto":
        return f"auto:{_TRAFFIC.get(cfg.workload.source, 'chat')}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    if type(value).__name__ == "ListConfig" or isinstance(value, list | tuple):
        return "rates:" + ",".join(f"{float(v):g}" for v in value)
    raise ConfigError("spec.acceptance", value, "auto, a mean accept length (e.g. 2.7) or per-position "
                      "rates (e.g. [0.8, 0.6, 0.5])")
