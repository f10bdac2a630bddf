"""The ``pd.*`` keys of a disaggregated trial, checked: each role's workers and layout, the transfer
backend, the bootstrap ports, the router's pairing policy, and what disaggregation cannot be combined with.
Each failure names the key, the value and what is valid (docs/disaggregation.md)."""

from __future__ import annotations

import importlib.util

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import (
    PD_ROLES,
    VLLM_ENGINES,
    ParasweepConf,
    role_config,
    role_gpus,
    server_nodes,
    world_size,
)
from orchestrator.errors import ConfigError
from vocab.model import PD_POLICIES, ROUTER_PACKAGE, VLLM_ROUTER_PACKAGE
from vocab.status import simulated

TRANSFER_BACKENDS = ("mooncake", "nixl", "mooncake_tcp", "fake")


def _count(key: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(key, value, f"an integer >= {low}")


def _validate_role(cfg: ParasweepConf, role: str) -> None:
    r = getattr(cfg.pd, role)
    _count(f"pd.{role}.workers", r.workers, 0 if role == "prefill" else 1)
    for attr in ("tp", "pp", "ep", "dp", "attention", "max_running_requests", "chunked_prefill_size"):
        value = getattr(r, attr)
        if value is not None and not (attr == "chunked_prefill_size" and value == -1):
            _count(f"pd.{role}.{attr}", value, 1)
    if r.mem_fraction_static is not None and not 0 < r.mem_fraction_static < 1:
        raise ConfigError(f"pd.{role}.mem_fraction_static", r.mem_fraction_static,
                          "a fraction in (0, 1) or null")
    one = role_config(cfg, role)
    model = model_info(cfg.model.path)
    if model.num_heads and model.num_heads % one.tp.size:
        divisors = [d for d in range(1, min(model.num_heads, 64) + 1) if model.num_heads % d == 0]
        raise ConfigError(f"pd.{role}.tp", one.tp.size, f"a divisor of {model.num_heads}: {divisors}",
                          why=f"model {cfg.model.name} has {model.num_heads} attention heads to shard")
    if one.pp.size > model.num_layers:
        raise ConfigError(f"pd.{role}.pp", one.pp.size, f"1..{model.num_layers}",
                          why=f"model {cfg.model.name} has {model.num_layers} layers")
    if one.ep.size > 1 and (not model.is_moe or one.tp.size % one.ep.size):
        raise ConfigError(f"pd.{role}.ep", one.ep.size,
                          f"a divisor of the role's tp ({one.tp.size}) on a MoE model",
                          why="expert parallelism lives inside the TP group")
    if one.tp.size % one.dp.attention:
        divisors = [d for d in range(1, one.tp.size + 1) if one.tp.size % d == 0]
        raise ConfigError(f"pd.{role}.attention", one.dp.attention,
                          f"a divisor of the role's tp ({one.tp.size}): {divisors}",
                          why="the ranks split the role's TP group")
    per_node = cfg.hardware.num_gpus
    if role_gpus(cfg, role) > per_node:
        raise ConfigError(f"pd.{role}.tp*pp*dp", role_gpus(cfg, role),
                          f"at most {per_node} (one node of hardware {cfg.hardware.name})",
                          why="each prefill or decode server runs on one node")


def validate_pd(cfg: ParasweepConf, engine: str) -> None:
    """``pd.*`` when disaggregation is on; nothing to check when it is off but that no role key was set
    in vain."""
    pd = cfg.pd
    if not isinstance(pd.enabled, bool):
        raise ConfigError("pd.enabled", pd.enabled, "true or false")
    if not pd.enabled:
        return
    for role in PD_ROLES:
        _validate_role(cfg, role)
    if pd.transfer_backend not in TRANSFER_BACKENDS:
        raise ConfigError("pd.transfer_backend", pd.transfer_backend, ", ".join(TRANSFER_BACKENDS))
    if (pd.prefill.workers == 0) != (pd.transfer_backend == "fake"):
        raise ConfigError("pd.prefill.workers", pd.prefill.workers,
                          ">= 1 with a transfer backend that moves KV; 0 with pd.transfer_backend=fake",
                          why="the fake backend is SGLang's decode server alone, with no prefill server")
    if pd.bootstrap_port is not None and not (isinstance(pd.bootstrap_port, int)
                                              and 1024 <= pd.bootstrap_port <= 65535 - pd.prefill.workers):
        raise ConfigError("pd.bootstrap_port", pd.bootstrap_port,
                          f"a port in 1024..{65535 - pd.prefill.workers} (one per prefill server from it), "
                          "or null")
    if pd.policy not in PD_POLICIES:
        raise ConfigError("pd.policy", pd.policy, ", ".join(PD_POLICIES))
    if pd.reserved_decode_tokens is not None:
        _count("pd.reserved_decode_tokens", pd.reserved_decode_tokens, 0)
    if cfg.dp.router_impl == "smg":
        raise ConfigError("dp.router_impl", "smg", "auto or engine with pd.enabled=true",
                          why="the router already runs in PD mode in front of the servers; DP within a "
                              "role is the server's own")
    for role in PD_ROLES:
        one = role_config(cfg, role)
        if one.dp.size > 1 and (simulated(engine) or cfg.predict):
            raise ConfigError(f"pd.{role}.dp", one.dp.size, "1 on the simulated engine and in predictions",
                              why="data parallelism inside a prefill or decode server is not modelled yet")
    if cfg.spec.algorithm != "none":
        raise ConfigError("spec.algorithm", cfg.spec.algorithm, "none with pd.enabled=true",
                          why="speculative decoding in a disaggregated deployment is not modelled yet")
    vllm = engine in VLLM_ENGINES
    if vllm:
        _vllm_keys(cfg)
    elif cfg.workload.api == "completions":
        raise ConfigError("workload.api", "completions", "generate or chat with pd.enabled=true",
                          why="the router refuses the token-id prompts parasweep sends to /v1/completions")
    live = not (cfg.predict or cfg.dry_run)
    if live and world_size(cfg) > cfg.hardware.num_gpus:
        raise ConfigError("pd.prefill.workers+pd.decode.workers", f"{pd.prefill.workers}+{pd.decode.workers}",
                          f"servers that fit one node ({cfg.hardware.num_gpus} GPUs of hardware "
                          f"{cfg.hardware.name}); wider deployments with predict=true or search",
                          why=f"the deployment takes {world_size(cfg)} GPUs, and a disaggregated trial "
                              "runs its servers and router on one node")
    placed = server_nodes(cfg)
    if placed and max(placed) >= cfg.hardware.nodes:
        sizes = "+".join(str(role_gpus(cfg, r)) for r in PD_ROLES for _ in range(getattr(pd, r).workers))
        raise ConfigError("pd.prefill.workers+pd.decode.workers", f"{pd.prefill.workers}+{pd.decode.workers}",
                          f"servers that fit the {cfg.hardware.nodes} node(s) of {cfg.hardware.num_gpus} "
                          f"GPUs of hardware {cfg.hardware.name}",
                          why=f"servers of {sizes} GPUs, each within one node and placed in order (prefill "
                              f"first), need {max(placed) + 1} nodes")
    module, package = ("vllm_router", VLLM_ROUTER_PACKAGE) if vllm else ("smg", ROUTER_PACKAGE)
    if live and importlib.util.find_spec(module) is None:
        raise ConfigError("pd.enabled", True, f"false, or install the router: pip install {package}",
                          why=f"the {engine} trial needs the router package in PD mode, which this Python "
                              "lacks")


def _vllm_keys(cfg: ParasweepConf) -> None:
    """What a disaggregated vLLM deployment takes of ``pd.*``: NIXL, vLLM's own side-channel ports and
    its scheduler's own admission (SGLang's bootstrap port and decode reserve have no vLLM counterpart)."""
    pd = cfg.pd
    if pd.transfer_backend != "nixl":
        raise ConfigError("pd.transfer_backend", pd.transfer_backend, "nixl with engine=vllm",
                          why="vLLM's KV connector parasweep launches is NIXL's (NixlConnector); its other "
                              "connectors are not built")
    if pd.bootstrap_port is not None:
        raise ConfigError("pd.bootstrap_port", pd.bootstrap_port, "null with engine=vllm",
                          why="SGLang's bootstrap server; each vLLM server's NIXL side channel gets a free "
                              "port of its own")
    if pd.reserved_decode_tokens is not None:
        raise ConfigError("pd.reserved_decode_tokens", pd.reserved_decode_tokens, "null with engine=vllm",
                          why="SGLang's --num-reserved-decode-tokens; vLLM's decode server takes a "
                              "request's KV when its scheduler has room for the prompt")
