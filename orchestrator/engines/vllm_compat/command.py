"""Config -> the ``vllm serve`` command line for one vLLM release, and its check against that release's
flags.

What both engines share is one set of keys, translated here (docs/vllm-adapter.md has the table):
the layout (``tp.size``, ``pp.size``, ``dp.size``, experts spread over every GPU with ``ep.size``), the
batch and token caps (``server.max_running_requests`` is vLLM's ``--max-num-seqs``,
``server.chunked_prefill_size`` its per-step token budget ``--max-num-batched-tokens``), the memory
fraction (``--gpu-memory-utilization``), prefix caching (``server.radix_cache``), CUDA graphs, the seed,
the model and how its weights load. What only SGLang has is refused in one line naming the key, and so
is what is not yet built for vLLM (disaggregation). Speculative decoding's keys become
``--speculative-config`` (``speculative.py``); a trial across nodes runs vLLM's multiprocessing executor
on every node (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``; ``--headless`` on all but
rank 0), as SGLang's one process per node. Every flag is
built with the key it came from and checked against the release's recorded flags, so a flag the release
lacks, a value where it takes none or a value outside its choices is refused against the key too.
"""

from __future__ import annotations

import dataclasses

from orchestrator.config.schema import ParasweepConf, trial_nodes
from orchestrator.engines.base import FIRST_NODE, NodePlace
from orchestrator.engines.launch_args import Arg, args_to_argv, flag_values, plain_value
from orchestrator.engines.vllm_compat.disagg import kv_transfer_args
from orchestrator.engines.vllm_compat.speculative import FLAG as SPEC_FLAG
from orchestrator.engines.vllm_compat.speculative import check_spec, spec_args
from orchestrator.engines.vllm_compat.versions import NEWEST_KNOWN, VLLMRelease, release
from orchestrator.errors import ConfigError
from simulator.vllm.cli import CONCURRENT_PARTIAL_PREFILL
from vocab.assets import model_dir

HOST = "127.0.0.1"  # servers are never exposed beyond this machine by default
MODULE = "vllm.entrypoints.cli.main"  # what the `vllm` command runs: `python -m ... serve MODEL ...`

# dests parasweep sets from its own keys: an extra arg for one of them would silently win, so it is
# refused with the key to use instead
MANAGED = {
    "model": "model.path", "model_tag": "model.path", "served_model_name": "model.name",
    "load_format": "model.load_format", "skip_tokenizer_init": "model.skip_tokenizer_init",
    "hf_overrides": "model.override_args", "tensor_parallel_size": "tp.size",
    "pipeline_parallel_size": "pp.size", "data_parallel_size": "dp.size", "enable_expert_parallel": "ep.size",
    "max_num_seqs": "server.max_running_requests", "max_num_batched_tokens": "server.chunked_prefill_size",
    "gpu_memory_utilization": "server.mem_fraction_static", "enforce_eager": "server.cuda_graph",
    "seed": "server.random_seed", "enable_prefix_caching": "server.radix_cache",
    "async_scheduling": "vllm.async_scheduling", "block_size": "vllm.block_size",
    "scheduling_policy": "vllm.scheduling_policy",
    "long_prefill_token_threshold": "vllm.long_prefill_token_threshold",
    "moe_backend": "vllm.moe_backend",
    "max_num_partial_prefills": "vllm.max_num_partial_prefills",
    "nnodes": "(the trial's nodes: tp.size x pp.size over hardware.num_gpus)",
    "node_rank": "(each node's rank, set by parasweep)", "headless": "(every node but rank 0)",
    "master_addr": "(rank 0's address, set by parasweep)", "master_port": "(next to the server's port)",
    "host": "(127.0.0.1: servers stay on this machine)",
    "kv_transfer_config": "pd.enabled and pd.transfer_backend",
    "port": "(chosen by parasweep: a free port per trial)",
}
# (key, its value when unset, why vLLM takes none of it): SGLang's own knobs
SGLANG_ONLY = (
    ("pp.async_depth", 0, "SGLang's PP async batch depth has no vLLM flag"),
    ("pp.micro_batch_size", None, "SGLang's PP micro-batch cap has no vLLM flag"),
    ("dp.attention", 1, "SGLang's attention-DP ranks; on vLLM, data parallelism with the experts spread "
                        "is dp.size with ep.size = tp.size x dp.size"),
    ("dp.router", "round_robin", "SGLang's DP controller; vLLM balances its DP ranks itself"),
    ("dp.router_impl", "auto", "a router process in front of DP replicas; vLLM's DP ranks are one server's"),
    ("ep.a2a_backend", "none", "SGLang's --moe-a2a-backend (vLLM's own all-to-all is not mapped yet)"),
    ("ep.deepep_mode", "auto", "SGLang's --deepep-mode"),
    ("ep.eplb", False, "SGLang's --enable-eplb (vLLM's own balancer is not mapped yet)"),
    ("ep.redundant_experts", 0, "SGLang's --ep-num-redundant-experts"),
    ("ep.two_batch_overlap", False, "SGLang's --enable-two-batch-overlap"),
    ("server.schedule_policy", "fcfs",
     "SGLang's --schedule-policy (vLLM schedules first come, first served)"),
    ("server.decode_log_interval", None, "SGLang's --decode-log-interval (vLLM logs every few seconds)"),
)


def _key(cfg: ParasweepConf, key: str) -> object:
    group, name = key.split(".")
    return getattr(getattr(cfg, group), name)


def refuse_what_vllm_lacks(cfg: ParasweepConf) -> None:
    """A one-line ConfigError for a key vLLM has no flag for, or one not built for vLLM yet."""
    for key, unset, why in SGLANG_ONLY:
        value = _key(cfg, key)
        if value != unset:
            raise ConfigError(key, value, f"{unset} with engine=vllm", why=why)
    partial = cfg.vllm.max_num_partial_prefills
    if partial not in (None, 1):
        raise ConfigError("vllm.max_num_partial_prefills", partial, "1 or null",
                          why=f"vLLM refuses it at start-up ({CONCURRENT_PARTIAL_PREFILL})")
    if trial_nodes(cfg) > 1 and cfg.dp.size > 1:
        raise ConfigError("dp.size", cfg.dp.size, "1 with a trial across nodes on vLLM",
                          why="parasweep spans nodes with vLLM's TP and PP ranks (--nnodes); DP ranks "
                              "across nodes are not built")
    experts = cfg.tp.size * cfg.dp.size
    if cfg.ep.size not in (1, experts):
        raise ConfigError("ep.size", cfg.ep.size, f"1 or tp.size x dp.size = {experts} with engine=vllm",
                          why="vLLM spreads the experts over every GPU of the TP and DP groups "
                              "(--enable-expert-parallel)")


def build_args(cfg: ParasweepConf, port: int, node: NodePlace = FIRST_NODE,
               version: str = NEWEST_KNOWN) -> list[Arg]:
    """The flags of ``vllm serve`` for this trial on ``node``, for vLLM ``version`` (the model is the
    positional argument before them)."""
    refuse_what_vllm_lacks(cfg)
    m, s = cfg.model, cfg.server
    args = [Arg("--served-model-name", [m.name], "model.name", m.name),
            Arg("--load-format", [m.load_format], "model.load_format", m.load_format),
            Arg("--host", [HOST], "(host)", HOST), Arg("--port", [str(port)], "(port)", port),
            Arg("--tensor-parallel-size", [str(cfg.tp.size)], "tp.size", cfg.tp.size),
            Arg("--pipeline-parallel-size", [str(cfg.pp.size)], "pp.size", cfg.pp.size),
            Arg("--data-parallel-size", [str(cfg.dp.size)], "dp.size", cfg.dp.size),
            Arg("--seed", [str(s.random_seed)], "server.random_seed", s.random_seed),
            # explicit either way: the default changed between releases
            Arg("--enable-prefix-caching" if s.radix_cache else "--no-enable-prefix-caching", [],
                "server.radix_cache", s.radix_cache)]
    if m.skip_tokenizer_init:
        args.append(Arg("--skip-tokenizer-init", [], "model.skip_tokenizer_init", True))
    override = plain_value(getattr(m, "override_args", None) or {})
    if override:
        args.append(Arg("--hf-overrides", flag_values(override), "model.override_args", override))
    if cfg.ep.size > 1:
        args.append(Arg("--enable-expert-parallel", [], "ep.size", cfg.ep.size))
    caps = (("server.max_running_requests", "--max-num-seqs", s.max_running_requests),
            ("server.chunked_prefill_size", "--max-num-batched-tokens", s.chunked_prefill_size),
            ("server.mem_fraction_static", "--gpu-memory-utilization", s.mem_fraction_static))
    for key, flag, value in caps:
        if value is not None:
            args.append(Arg(flag, [str(value)], key, value))
    if not s.cuda_graph:
        args.append(Arg("--enforce-eager", [], "server.cuda_graph", False))
    args += _own(cfg)
    args += spec_args(cfg, version)
    args += kv_transfer_args(cfg, version)
    args += _across_nodes(cfg, port, node)
    for name, value in plain_value(s.extra_args).items():
        args.append(_extra(str(name), value))
    return args


def _across_nodes(cfg: ParasweepConf, port: int, node: NodePlace) -> list[Arg]:
    """A trial across nodes: one ``vllm serve`` per node of vLLM's multiprocessing executor (vLLM's
    choice where ``--nnodes`` > 1), meeting at rank 0's ``--master-addr``:``--master-port`` (the port
    next to the server's); every node but rank 0 runs ``--headless`` (workers only, no API server)."""
    nodes = trial_nodes(cfg)
    if nodes == 1:
        return []
    key = "(tp.size x pp.size over hardware.num_gpus)"
    args = [Arg("--nnodes", [str(nodes)], key, nodes),
            Arg("--node-rank", [str(node.rank)], "(the node's rank)", node.rank),
            Arg("--master-addr", [node.head], "(rank 0's address)", node.head),
            Arg("--master-port", [str(port + 1)], "(rank 0's address)", port + 1)]
    if node.rank > 0:
        args.append(Arg("--headless", [], "(a node other than rank 0)", True))
    return args


def _own(cfg: ParasweepConf) -> list[Arg]:
    """``vllm.*``: vLLM's own knobs, each its flag where set (a bool as --x or --no-x)."""
    args = []
    for f in dataclasses.fields(cfg.vllm):
        value = getattr(cfg.vllm, f.name)
        if value is None or f.name == "release":  # which release, not a flag of it
            continue
        flag, key = "--" + f.name.replace("_", "-"), f"vllm.{f.name}"
        if isinstance(value, bool):
            args.append(Arg(flag if value else "--no-" + flag[2:], [], key, value))
        else:
            args.append(Arg(flag, [str(value)], key, value))
    return args


def _extra(name: str, value: object) -> Arg:
    key = f"server.extra_args.{name}"
    dest = name.lstrip("-").replace("-", "_")
    if dest in MANAGED:
        raise ConfigError(key, value, f"set it with {MANAGED[dest]}",
                          why="parasweep passes it from its own key, which the prediction, the diagnosis and "
                              "the search read")
    flag = name if name.startswith("-") else "--" + name.replace("_", "-")
    return Arg(flag, [] if value is True else flag_values(value), key, value)


def check_args(args: list[Arg], rel: VLLMRelease) -> list[Arg]:
    """``args`` as ``rel`` accepts them, or a one-line ConfigError naming the key: a flag the release
    lacks, a value given to a flag that takes none (or none to one that needs it), a value outside its
    choices."""
    for a in args:
        flag = rel.flags.get(a.flag)
        if flag is None:
            raise ConfigError(a.key, a.value, f"a flag of vLLM {rel.version}",
                              why=f"vLLM {rel.version} has no {a.flag} ({rel.source})")
        if flag.value is False and a.values:
            raise ConfigError(a.key, a.value, "true (a bare flag)", why=f"{a.flag} takes no value")
        if flag.value is True and not a.values:
            raise ConfigError(a.key, a.value, "a value", why=f"{a.flag} needs a value")
        if flag.choices and any(v not in flag.choices for v in a.values):
            raise ConfigError(a.key, a.value, ", ".join(flag.choices),
                              why=f"vLLM {rel.version}'s {a.flag} takes one of its choices ({rel.source})")
        if a.flag == SPEC_FLAG:
            check_spec(a, args, rel)
    return args


def vllm_argv(cfg: ParasweepConf, python: str, port: int, version: str = NEWEST_KNOWN,
              node: NodePlace = FIRST_NODE) -> list[str]:
    """``python -m vllm.entrypoints.cli.main serve MODEL FLAGS...`` for this trial on ``node``, checked
    against vLLM ``version``'s recorded flags."""
    args = check_args(build_args(cfg, port, node, version), release(version))
    return [python, "-m", MODULE, "serve", str(model_dir(cfg.model.path)),
            *args_to_argv(args)]
