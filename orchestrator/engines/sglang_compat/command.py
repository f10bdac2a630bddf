"""Config -> SGLang launch flags for one SGLang version, and the preflight check against its flag set.

Every flag is built with the config key it came from, so a flag the target version does not know is
reported against the key the user can change, in one line, before anything launches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.schema import ParasweepConf, trial_nodes
from orchestrator.engines.launch_args import Arg, flag_values, plain_value
from orchestrator.engines.sglang_compat.disagg import pd_flags
from orchestrator.engines.sglang_compat.speculative import spec_flags
from orchestrator.engines.sglang_compat.versions import (
    NEWEST_KNOWN,
    RENAMES,
    SCHEDULE_POLICY_SINCE,
    FlagSet,
    canonical_name,
    parse_version,
    spelling,
)
from orchestrator.errors import ConfigError
from vocab.assets import model_dir

# rank 0's host in the --dist-init-addr of a trial across nodes, as planned on this machine (a dry run,
# a prediction); a trial launched on a Ray cluster gives rank 0's node address instead (NodePlace.head)
DIST_INIT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodePlace:
    """Where one engine process of a trial runs: its node rank (0 serves HTTP) and the host of rank 0,
    which the other nodes join (``--dist-init-addr``). A trial on one node is rank 0 of 1."""

    rank: int = 0
    head: str = DIST_INIT_HOST


FIRST_NODE = NodePlace()

HOST = "127.0.0.1"  # servers are never exposed beyond this machine by default

# dests parasweep sets from its own config keys: an extra arg for one of them would silently win
# (argparse keeps the last value), so it is refused with the key to use instead
_MANAGED = {
    "model_path": "model.path", "served_model_name": "model.name", "load_format": "model.load_format",
    "skip_tokenizer_init": "model.skip_tokenizer_init", "json_model_override_args": "model.override_args",
    "tp_size": "tp.size", "tensor_parallel_size": "tp.size", "pp_size": "pp.size",
    "pipeline_parallel_size": "pp.size", "ep_size": "ep.size", "expert_parallel_size": "ep.size",
    "dp_size": "dp.size", "data_parallel_size": "dp.size", "pp_async_batch_depth": "pp.async_depth",
    "pp_max_micro_batch_size": "pp.micro_batch_size", "max_micro_batch_size": "pp.micro_batch_size",
    "max_running_requests": "server.max_running_requests",
    "chunked_prefill_size": "server.chunked_prefill_size",
    "mem_fraction_static": "server.mem_fraction_static", "disable_cuda_graph": "server.cuda_graph",
    "decode_log_interval": "server.decode_log_interval", "random_seed": "server.random_seed",
    "disable_radix_cache": "server.radix_cache", "schedule_policy": "server.schedule_policy",
    "port": "(chosen by parasweep: a free port per trial)", "enable_metrics": "(always on)",
    "speculative_algorithm": "spec.algorithm", "speculative_draft_model_path": "spec.draft_model",
    "speculative_num_steps": "spec.num_steps", "speculative_eagle_topk": "spec.topk",
    "speculative_num_draft_tokens": "spec.num_draft_tokens",
    "speculative_draft_load_format": "spec.draft_load_format",
    "attn_dp_size": "dp.attention", "enable_dp_attention": "dp.attention",
    "load_balance_method": "dp.router", "moe_a2a_backend": "ep.a2a_backend", "deepep_mode": "ep.deepep_mode",
    "enable_eplb": "ep.eplb", "ep_num_redundant_experts": "ep.redundant_experts",
    "enable_two_batch_overlap": "ep.two_batch_overlap",
}
# of those, the ones an extra arg may never set, even where parasweep leaves the flag out: the prediction,
# the diagnosis and the search read them from their keys
_ALWAYS_MANAGED = ("schedule_policy", "disable_radix_cache", "attn_dp_size", "enable_dp_attention",
                   "load_balance_method", "moe_a2a_backend", "deepep_mode", "enable_eplb",
                   "ep_num_redundant_experts", "enable_two_batch_overlap")


def decode_log_interval(cfg: ParasweepConf) -> int:
    """SGLang's decode log samples every Nth processed slot; with N a multiple of the PP loop size
    every line shows the same micro-batch. Pick the smallest N >= 40 coprime with the loop size."""
    if cfg.server.decode_log_interval is not None:
        return cfg.server.decode_log_interval
    loop = cfg.pp.size + cfg.pp.async_depth if cfg.pp.size > 1 else 1
    n = 40
    while math.gcd(n, loop) != 1:
        n += 1
    return n


def _moe_layout(args: list[Arg], cfg: ParasweepConf, version: str, flags: FlagSet | None) -> None:
    """Attention DP, as each release spells it (``--attn-dp-size`` from 0.5.22; before, --dp-size
    counting the ranks with ``--enable-dp-attention``), the DP controller's method, and the experts'
    all-to-all backend, its mode and balancer."""
    ranks = cfg.dp.attention
    if ranks > 1:
        flag = spelling("attn_dp_size", version, flags)
        if flag is not None:
            args.append(Arg(flag, [str(ranks)], "dp.attention", ranks))
        else:
            dp = next(a for a in args if a.key == "dp.size")
            dp.values, dp.key, dp.value, dp.optional = [str(ranks)], "dp.attention", ranks, False
            args.append(Arg("--enable-dp-attention", [], "dp.attention", ranks))
    if cfg.dp.router == "total_requests" and (ranks > 1 or cfg.dp.size > 1):
        args.append(Arg("--load-balance-method", ["total_requests"], "dp.router", cfg.dp.router))
    ep = cfg.ep
    if ep.a2a_backend != "none":
        args.append(Arg("--moe-a2a-backend", [ep.a2a_backend], "ep.a2a_backend", ep.a2a_backend))
    if ep.deepep_mode != "auto":
        args.append(Arg("--deepep-mode", [ep.deepep_mode], "ep.deepep_mode", ep.deepep_mode))
    if ep.eplb:
        args.append(Arg("--enable-eplb", [], "ep.eplb", True))
    if ep.redundant_experts:
        args.append(Arg("--ep-num-redundant-experts", [str(ep.redundant_experts)], "ep.redundant_experts",
                        ep.redundant_experts))
    if ep.two_batch_overlap:
        args.append(Arg("--enable-two-batch-overlap", [], "ep.two_batch_overlap", True))


def refuse_what_sglang_refuses(cfg: ParasweepConf) -> None:
    """SGLang's own checks on values parasweep passes, made before launch so a layout SGLang would
    refuse on the GPU node is refused here in one line. Each mirrors an assertion or error of SGLang's
    server-argument code (recorded per release under "checks" in releases/sglang-<version>.json):
    ':' in served_model_name (0.5.9 and 0.5.23), and attention DP's size: positive, a divisor of
    tp_size, and never together with dp_size > 1 (parallel_hook.py of 0.5.22 and later; before 0.5.22
    the same holds for the --dp-size that --enable-dp-attention reinterprets)."""
    name = cfg.model.name
    if ":" in name:
        raise ConfigError("model.name", name, "a name without ':'",
                          "SGLang refuses ':' in --served-model-name (it is reserved for 'model:adapter')")
    ranks = cfg.dp.attention
    if ranks < 1:
        raise ConfigError("dp.attention", ranks, "a positive integer (attention-DP ranks)",
                          "SGLang: --attn-dp-size must be positive")
    if ranks > 1 and cfg.dp.size > 1:
        raise ConfigError("dp.attention", ranks, f"1 with dp.size={cfg.dp.size}, or dp.size=1",
                          "SGLang refuses data-parallel replicas combined with attention data parallelism")
    if cfg.tp.size % ranks:
        raise ConfigError("dp.attention", ranks, f"a divisor of tp.size={cfg.tp.size}",
                          "SGLang splits each TP group into attention-DP ranks "
                          "(tp_size % attn_dp_size == 0)")


def _extra(args: list[Arg], cfg: ParasweepConf, version: str, flags: FlagSet | None) -> None:
    for name, value in (cfg.server.extra_args or {}).items():
        key = f"server.extra_args.{name}"
        canonical = canonical_name(name)
        if value is False or value is None:
            continue
        if canonical in _ALWAYS_MANAGED or (canonical.startswith("speculative_") and canonical in _MANAGED):
            raise ConfigError(key, value, f"set it with {_MANAGED[canonical]}",
                              "parasweep passes it from its own key, which the prediction, the diagnosis "
                              "and the search read")
        flag = spelling(canonical, version, flags)
        if flag is None:
            raise ConfigError(key, value, f"a flag of SGLang {version}",
                              f"SGLang {version} has no spelling of --{canonical.replace('_', '-')}")
        if name.startswith("--") and canonical not in RENAMES:
            flag = name  # written as a flag and never renamed: keep it verbatim
        args.append(Arg(flag, [] if value is True else flag_values(value), key, value))


def dist_init_addr(port: int, host: str) -> str:
    """Rank 0's address for the other nodes to join (SGLang's ``--dist-init-addr HOST:PORT``): a port
    next to the server's."""
    return f"{host}:{port + 1}"


def build_args(cfg: ParasweepConf, port: int, version: str = NEWEST_KNOWN,
               flags: FlagSet | None = None, node: NodePlace = FIRST_NODE) -> list[Arg]:
    """The flags for this trial on SGLang ``version``: full names only (SGLang accepts unique prefixes,
    and `--pp` is ambiguous since 0.5.7), defaults left to the engine unless the config sets them."""
    m, s = cfg.model, cfg.server
    args = [
        Arg("--model-path", [str(model_dir(m.path))], "model.path", m.path),
        Arg("--served-model-name", [m.name], "model.name", m.name),
        Arg("--load-format", [m.load_format], "model.load_format", m.load_format),
        Arg("--tp-size", [str(cfg.tp.size)], "tp.size", cfg.tp.size, optional=cfg.tp.size == 1),
        Arg("--pp-size", [str(cfg.pp.size)], "pp.size", cfg.pp.size, optional=cfg.pp.size == 1),
        Arg("--ep-size", [str(cfg.ep.size)], "ep.size", cfg.ep.size, optional=cfg.ep.size == 1),
        Arg("--dp-size", [str(cfg.dp.size)], "dp.size", cfg.dp.size, optional=cfg.dp.size == 1),
    ]
    if m.skip_tokenizer_init:
        args.append(Arg("--skip-tokenizer-init", [], "model.skip_tokenizer_init", True))
    override = plain_value(getattr(m, "override_args", None) or {})
    if override:  # e.g. {"num_hidden_layers": 2}: shrink a model for a smoke test
        args.append(Arg("--json-model-override-args", flag_values(override), "model.override_args", override))
    if cfg.pp.size > 1:
        depth = cfg.pp.async_depth
        flag = spelling("pp_async_batch_depth", version, flags)
        if flag is not None:
            args.append(Arg(flag, [str(depth)], "pp.async_depth", depth))
        elif depth > 0:
            raise ConfigError("pp.async_depth", depth, f"0 with SGLang {version}",
                              "--pp-async-batch-depth exists only in SGLang 0.5.7 and later")
    if cfg.pp.micro_batch_size is not None:
        flag = spelling("pp_max_micro_batch_size", version, flags) or "--pp-max-micro-batch-size"
        args.append(Arg(flag, [str(cfg.pp.micro_batch_size)], "pp.micro_batch_size", cfg.pp.micro_batch_size))
    for attr, flag in (("max_running_requests", "--max-running-requests"),
                       ("chunked_prefill_size", "--chunked-prefill-size"),
                       ("mem_fraction_static", "--mem-fraction-static")):
        value = getattr(s, attr)
        if value is not None:
            args.append(Arg(flag, [str(value)], f"server.{attr}", value))
    if not s.cuda_graph:
        args.append(Arg("--disable-cuda-graph", [], "server.cuda_graph", False))
    if not s.radix_cache:
        args.append(Arg("--disable-radix-cache", [], "server.radix_cache", False))
    if s.schedule_policy != "fcfs":
        policy = s.schedule_policy
        since = SCHEDULE_POLICY_SINCE.get(policy)
        if since is not None and parse_version(version) < since:
            first = ".".join(map(str, since))
            raise ConfigError("server.schedule_policy", policy, f"a policy SGLang {version} accepts",
                              f"{policy} is new in SGLang {first}")
        args.append(Arg("--schedule-policy", [policy], "server.schedule_policy", policy))
    args += [Arg(flag, values, key, value) for flag, values, key, value in spec_flags(cfg, version)]
    args += [Arg(flag, values, key, value) for flag, values, key, value in pd_flags(cfg, version)]
    interval = decode_log_interval(cfg)
    args += [
        Arg("--enable-metrics", [], "(always on)", True),
        Arg("--decode-log-interval", [str(interval)], "server.decode_log_interval", interval),
        Arg("--random-seed", [str(s.random_seed)], "server.random_seed", s.random_seed),
        Arg("--host", [HOST], "server.extra_args.host", HOST),
        Arg("--port", [str(port)], "(chosen by parasweep)", port),
    ]
    nodes = trial_nodes(cfg)
    if nodes > 1:  # one process per node; rank 0 serves HTTP and the others join it
        args += [Arg("--nnodes", [str(nodes)], "(world size over hardware.num_gpus)", nodes),
                 Arg("--node-rank", [str(node.rank)], "(the node's place)", node.rank),
                 Arg("--dist-init-addr", [dist_init_addr(port, node.head)], "(rank 0's address)",
                     dist_init_addr(port, node.head))]
    refuse_what_sglang_refuses(cfg)
    _moe_layout(args, cfg, version, flags)
    _extra(args, cfg, version, flags)
    return _dedupe_host(args)


def _dedupe_host(args: list[Arg]) -> list[Arg]:
    """``server.extra_args.host`` replaces the default bind address instead of repeating --host."""
    hosts = [a for a in args if a.flag == "--host"]
    if len(hosts) > 1:
        hosts[0].values = hosts[-1].values
        args = [a for a in args if a is not hosts[-1]]
    return args


def check_args(args: list[Arg], flags: FlagSet, version: str) -> list[Arg]:
    """Refuse any flag ``flags`` does not list exactly (an abbreviation included), a flag that repeats
    one parasweep sets from a config key, and a value where the flag takes none (or the reverse).
    Returns the args with defaults dropped that this version has no flag for."""
    kept: list[Arg] = []
    seen: dict[str, Arg] = {}
    for a in args:
        if a.flag not in flags:
            if a.optional:
                continue
            longer = flags.prefix_matches(a.flag)
            hint = (f"; {a.flag} would be an abbreviation of {', '.join(longer[:4])}, which parasweep never "
                    "passes" if longer else "")
            raise ConfigError(a.key, a.value, f"a full flag name of SGLang {version} "
                              f"(see `python -m sglang.launch_server --help`)",
                              f"{a.flag} is not a flag of SGLang {version}, per the {flags.source}{hint}")
        dest = flags.dest(a.flag) or a.flag
        if dest in seen and a.key.startswith("server.extra_args.") and a.flag != "--host":
            owner = _MANAGED.get(dest, seen[dest].key)
            raise ConfigError(a.key, a.value, f"set it with {owner}",
                              f"{a.flag} is already set by parasweep from {seen[dest].key}")
        seen[dest] = a
        takes = flags.takes_value.get(a.flag)
        if takes is False and a.values:
            raise ConfigError(a.key, a.value, "true (a bare flag)", f"{a.flag} takes no value")
        if takes is True and not a.values:
            raise ConfigError(a.key, a.value, "a value", f"{a.flag} needs a value")
        kept.append(a)
    check_choices(kept, flags, version)
    return kept


def check_choices(args: list[Arg], flags: FlagSet, version: str) -> None:
    """Refuse a value outside the choices the release lists for its flag (argparse's own check)."""
    for a in args:
        choices = flags.choices.get(a.flag)
        if choices and any(v not in [str(c) for c in choices] for v in a.values):
            raise ConfigError(a.key, a.value, ", ".join(map(str, choices)),
                              f"SGLang {version}'s {a.flag} takes one of its choices, per the {flags.source}")


