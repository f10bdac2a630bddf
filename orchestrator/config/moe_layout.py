"""The keys of a MoE deployment's layout beyond TP, PP and DP: attention data parallelism
(``dp.attention``) and how the experts are reached and balanced (``ep.a2a_backend``, ``ep.deepep_mode``,
``ep.eplb``, ``ep.redundant_experts``). Checked here for what holds on every SGLang release; which
all-to-all backends a release accepts is its own (``engines/sglang_compat``). docs/attention-dp.md."""

from __future__ import annotations

from orchestrator.config.schema import ParasweepConf
from orchestrator.errors import ConfigError
from vocab.model import ModelInfo

DEEPEP_MODES = ("auto", "normal", "low_latency")


def validate_moe_layout(cfg: ParasweepConf, model: ModelInfo) -> None:
    ranks, tp = cfg.dp.attention, cfg.tp.size
    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError("dp.attention", ranks, "an integer >= 1 (attention-DP ranks; 1: none)")
    if ranks > 1:
        if tp % ranks:
            divisors = [d for d in range(1, tp + 1) if tp % d == 0]
            raise ConfigError("dp.attention", ranks, f"a divisor of tp.size={tp}: {divisors}",
                              why="the ranks split the TP group's GPUs between them")
        if cfg.dp.size > 1:
            raise ConfigError("dp.attention", ranks, f"1 with dp.size={cfg.dp.size}, or dp.size=1",
                              why="SGLang refuses data-parallel replicas combined with attention data "
                                  "parallelism")
        if cfg.dp.router == "cache_aware":
            raise ConfigError("dp.router", "cache_aware",
                              "round_robin or total_requests with dp.attention > 1",
                              why="the ranks sit inside one engine, behind its own DP controller")
    if cfg.ep.deepep_mode not in DEEPEP_MODES:
        raise ConfigError("ep.deepep_mode", cfg.ep.deepep_mode, ", ".join(DEEPEP_MODES))
    for key in ("eplb", "two_batch_overlap"):
        if not isinstance(getattr(cfg.ep, key), bool):
            raise ConfigError(f"ep.{key}", getattr(cfg.ep, key), "true or false")
    redundant = cfg.ep.redundant_experts
    if not isinstance(redundant, int) or redundant < 0:
        raise ConfigError("ep.redundant_experts", redundant, "an integer >= 0")
    moe_keys = {"ep.a2a_backend": cfg.ep.a2a_backend != "none", "ep.eplb": cfg.ep.eplb,
                "ep.redundant_experts": redundant > 0, "ep.deepep_mode": cfg.ep.deepep_mode != "auto",
                "ep.two_batch_overlap": cfg.ep.two_batch_overlap}
    for key, set_ in moe_keys.items():
        if set_ and not model.is_moe:
            raise ConfigError(key, _value(cfg, key), "its default",
                              why=f"model {cfg.model.name} has no experts")
    if cfg.ep.deepep_mode != "auto" and cfg.ep.a2a_backend != "deepep":
        raise ConfigError("ep.deepep_mode", cfg.ep.deepep_mode, "auto unless ep.a2a_backend=deepep",
                          why="the mode is DeepEP's")
    if (cfg.ep.eplb or redundant) and cfg.ep.size == 1 and cfg.ep.a2a_backend == "none":
        key = "ep.eplb" if cfg.ep.eplb else "ep.redundant_experts"
        raise ConfigError(key, _value(cfg, key), "with ep.size > 1 or an all-to-all backend",
                          why="the balancer places whole experts on the EP group's GPUs")


def _value(cfg: ParasweepConf, key: str) -> object:
    group, name = key.split(".")
    return getattr(getattr(cfg, group), name)
