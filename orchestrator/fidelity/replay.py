"""One published entry replayed on the simulated engine, the way it was measured.

The entry's launch (model, GPU, layout, server flags) becomes the simulated engine's flags; its
benchmark (tool, dataset, prompt count, lengths, rate, concurrency cap, seed) becomes the exact list of
requests that tool sends (``workloads.bench_serving``); the engine runs them in virtual time
(``simulator.replay``) and the tool's own numbers are computed from the records. What parasweep cannot
model raises :class:`NotModelled` with the reason, before anything runs.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.engines.vllm_compat.disagg import kv_transfer_config
from orchestrator.fidelity.catalog import NotModelled, across_nodes, hardware_profile, model_folder
from orchestrator.fidelity.corpus import DISAGGREGATED, Entry, Role
from orchestrator.fidelity.releases import release_defaults
from orchestrator.fidelity.vllm_launch import vllm_argv
from orchestrator.prediction.modelled import engine_env
from simulator.model_spec import ModelSpec, load_model_spec
from simulator.predict import VirtualTrial, load_config
from simulator.predict_disagg import load_layout
from simulator.replay import replay_on
from vocab.hardware import load_hardware, place_servers
from workloads.bench_serving import (
    DEFAULT_SEED,
    BenchRequest,
    arrival_offsets,
    bench_metrics,
    random_lengths,
    sharegpt_lengths,
)

# Benchmark tools whose sending the replay follows (lower-cased prefixes of ``workload.tool``)
SGLANG_BENCH = "sglang.bench_serving"
VLLM_BENCH = ("vllm bench",)
# vLLM's older benchmarks/benchmark_serving.py (InferenceX's client is a fork of it) draws random lengths
# one-sided from ratio x L to L, as SGLang's tool does; aiperf sends fixed lengths
ONE_SIDED_BENCH = ("benchmark_serving",)
FIXED_LENGTH_BENCH = ("aiperf",)
SINGLE_REQUEST_DATASETS = ("synthetic single request", "synthetic input_ids")
# num_prompts requests of input_len / output_len tokens, all sent at once (a source that averages a
# throughput over a few identical long requests without naming its client)
BURST_DATASET = "synthetic burst"
VLLM_SEED = 0  # vLLM's bench serve --seed default


@dataclass
class Plan:
    """What the replay runs for one entry."""

    argv: list[str]
    env: dict[str, str]  # the engine's environment the launch had
    requests: list[BenchRequest]
    max_concurrency: int | None
    family: str  # dense | moe | pp | router
    layout: str  # TP | EP
    hardware: str  # the profile's name
    notes: list[str] = field(default_factory=list)  # assumptions, each said with the result
    # a disaggregated run: each role's flags and server count, the deployment ``argv`` stands aside for
    roles: Roles | None = None


@dataclass(frozen=True)
class Roles:
    """A disaggregated run's servers as the simulated engine runs them (``simulator.predict_disagg``)."""

    prefill_argv: list[str]
    decode_argv: list[str]
    prefill_workers: int
    decode_workers: int


def _flags(a: dict[str, Any]) -> list[str]:
    """A run's server flags (``server_args``) the simulated engine models, as SGLang flags."""
    out: list[str] = []

    def number(key: str) -> int | float | None:
        v = a.get(key)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    for key, flag in (("chunked_prefill_size", "--chunked-prefill-size"),
                      ("max_running_requests", "--max-running-requests"),
                      ("cuda_graph_max_bs", "--cuda-graph-max-bs"),
                      ("stream_interval", "--stream-interval"),
                      ("scheduler_recv_interval", "--scheduler-recv-interval"),
                      ("max_prefill_tokens", "--max-prefill-tokens"),
                      ("max_total_num_tokens", "--max-total-tokens"),
                      ("page_size", "--page-size")):
        v = number(key)
        if v is not None:
            out += [flag, str(int(v))]
    mem = number("mem_fraction_static")
    if mem is not None:
        out += ["--mem-fraction-static", str(mem)]
    ctx = number("context_length")
    if ctx is not None:
        out += ["--context-length", str(int(ctx))]
    if a.get("disable_radix_cache") is True or a.get("radix_cache") is False:
        out.append("--disable-radix-cache")
    graph = a.get("cuda_graph")
    if graph is False or (isinstance(graph, str) and graph.lower().startswith(("off", "disabled"))):
        out.append("--disable-cuda-graph")
    if a.get("enable_mixed_chunk") is True:
        out.append("--enable-mixed-chunk")
    for key in ("kv_cache_dtype", "quantization"):
        if isinstance(a.get(key), str):
            out += [f"--{key.replace('_', '-')}", a[key]]
    return out


def _single_request(entry: Entry) -> bool:
    """One request of a published length (a long-context TTFT, a speed benchmark), not a benchmark run
    of one prompt drawn from a dataset."""
    w = entry.workload
    return w.dataset.lower().startswith(SINGLE_REQUEST_DATASETS) or (
        w.num_prompts == 1 and w.input_len is not None and w.random_input_len is None)


def _requests(entry: Entry, model_dir: Path, spec: ModelSpec, notes: list[str]
              ) -> tuple[list[BenchRequest], int | None]:
    w = entry.workload
    tool = w.tool.lower()
    dataset = w.dataset.lower()
    if _single_request(entry):
        if w.input_len is None:
            raise NotModelled("a single request without workload.input_len")
        out = w.output_len if w.output_len is not None else 1
        if w.output_len is None:
            notes.append("output length not published: one output token (TTFT only)")
        if w.num_prompts != 1:
            raise NotModelled(f"{w.num_prompts} requests of a synthetic workload whose sending is not "
                              "published (only one request at a time is replayed)")
        return [BenchRequest(w.input_len, out, 0.0)], 1
    if dataset.startswith(BURST_DATASET):
        if w.input_len is None or w.output_len is None:
            raise NotModelled("a synthetic burst needs workload.input_len and workload.output_len")
        return [BenchRequest(w.input_len, w.output_len, 0.0) for _ in range(w.num_prompts)], w.max_concurrency
    sglang = tool.startswith(SGLANG_BENCH)
    one_sided = sglang or tool.startswith(ONE_SIDED_BENCH)
    fixed = tool.startswith(FIXED_LENGTH_BENCH)
    if not one_sided and not fixed and not tool.startswith(VLLM_BENCH):
        raise NotModelled(f"benchmark tool {w.tool!r}: its sending is not replayed (sglang.bench_serving, "
                          "vllm bench serve, benchmark_serving, aiperf)")
    seed = w.seed if w.seed is not None else (DEFAULT_SEED if sglang else VLLM_SEED)
    rng = np.random.RandomState(seed)
    rate = w.request_rate if w.request_rate is not None else math.inf
    if dataset.startswith("random"):
        if w.random_input_len is None or w.random_output_len is None:
            raise NotModelled("random dataset without random_input_len / random_output_len")
        # SGLang's tool draws from ratio x L to L; vLLM's around L, within +-ratio (0.0: exactly L)
        ratio = 1.0 if fixed else w.random_range_ratio or 0.0
        if not one_sided and not fixed:
            if ratio:
                raise NotModelled(f"vLLM's --random-range-ratio {ratio:g} (lengths drawn around the "
                                  "nominal one): only fixed lengths are replayed for that tool")
            ratio = 1.0
        ins, outs = random_lengths(w.num_prompts, w.random_input_len, w.random_output_len, ratio, rng)
    elif dataset.startswith("sharegpt"):
        ins, outs = sharegpt_lengths(w.num_prompts, _sharegpt_pairs(model_dir, spec, notes), seed,
                                     fixed_output_len=w.output_len)
    else:
        raise NotModelled(f"dataset {w.dataset!r} is not replayed (random, random-ids, sharegpt)")
    offsets = arrival_offsets(w.num_prompts, rate, rng)
    reqs = [BenchRequest(int(i), int(o), float(t)) for i, o, t in zip(ins, outs, offsets, strict=True)]
    return reqs, w.max_concurrency


def _sharegpt_pairs(model_dir: Path, spec: ModelSpec, notes: list[str]) -> list[tuple[int, int]]:
    """(prompt, reply) token counts of the packaged ShareGPT's elements, by the model's tokenizer."""
    from workloads.sources.sharegpt import first_two_turns
    from workloads.sources.tokenize import pick

    name, what = pick(model_dir, spec.model_type, spec.vocab)
    pairs = [(int(a), int(b)) for a, b in first_two_turns(None, name)]
    notes.append(f"ShareGPT: the {len(pairs):,} elements of the packaged copy (the tool shuffles the whole "
                 f"file: the same kind of sample, not the same prompts), tokenized by {what}")
    return pairs


def plan(entry: Entry, workdir: Path) -> Plan:
    """The flags and requests that replay ``entry``; raises :class:`NotModelled` with the reason."""
    p = entry.parallelism
    if entry.workload.dataset.lower().startswith("generated-shared-prefix"):
        raise NotModelled("the generated-shared-prefix dataset is not replayed yet (its one published run, "
                          "behind a router, does not say whether its throughput counts input tokens only)")
    model_dir, model_note = model_folder(entry.model, entry.parasweep.get("model"))
    profile = hardware_profile(entry.gpu, entry.parasweep.get("hardware"))
    notes = [model_note] if model_note else []
    profile, net_note = across_nodes(profile, entry.nodes, workdir)
    if net_note:
        notes.append(net_note)
    calibration = entry.parasweep.get("calibration")  # constants in place of the model's defaults
    if entry.parasweep.get("engine") == "vllm":  # played by the simulated engine playing vLLM
        return _vllm_plan(entry, model_dir, profile, calibration, notes)
    argv = ["--model-path", str(model_dir), "--sim-hardware", str(profile), "--sim-step-costs", "auto",
            *(["--sim-calibration", calibration] if calibration else []),
            "--tp-size", str(p.tp), "--pp-size", str(p.pp), "--ep-size", str(p.ep), "--dp-size", str(p.dp)]
    if p.dp_attention:  # as these releases spelt it: --dp-size counts the attention-DP ranks
        argv.append("--enable-dp-attention")
        if (p.model_extra or {}).get("enable_dp_lm_head"):
            argv.append("--enable-dp-lm-head")
    if entry.nodes > 1:
        argv += ["--nnodes", str(entry.nodes), "--dist-init-addr", "127.0.0.1:5000"]
    if p.pp_async_batch_depth is not None:
        argv += ["--pp-async-batch-depth", str(p.pp_async_batch_depth)]
    if p.pp_max_micro_batch_size is not None:
        argv += ["--pp-max-micro-batch-size", str(p.pp_max_micro_batch_size)]
    argv += _flags(entry.server_args)
    old, old_notes = release_defaults(entry.sglang_version, entry.server_args, p.tp,
                                      load_hardware(str(profile)).memory_gb * 1e9 / 2**20, p.dp_attention)
    argv += old
    notes += old_notes
    spec = load_model_spec(str(model_dir))
    requests, cap = _requests(entry, model_dir, spec, notes)
    env: dict[str, str] = {}
    context = entry.server_args.get("context_length")
    if isinstance(context, int) and context > spec.max_context_length:
        # a longer context than the config's, as the published launch set it (SGLang refuses it otherwise)
        env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
        notes.append(f"context length {context:,} over the config's {spec.max_context_length:,}, "
                     "as published")
    _fits_context(requests, context, spec)
    if entry.disaggregation is not None:
        return _disaggregated(entry, argv[:argv.index("--tp-size")], requests, cap, env, notes,
                              spec.is_moe, profile)
    replicas = 1 if p.dp_attention else p.dp  # attention-DP ranks live inside the TP group
    if p.tp * p.pp * replicas > entry.gpu_count:
        raise NotModelled(f"tp*pp*dp = {p.tp * p.pp * replicas} needs more than the {entry.gpu_count} GPUs "
                          "published")
    family = "pp" if p.pp > 1 else "router" if replicas > 1 else "moe" if spec.is_moe else "dense"
    layout = "attention DP" if p.dp_attention else "EP" if p.ep > 1 else "TP"
    return Plan(argv=argv, env=env, requests=requests, max_concurrency=cap, family=family,
                layout=layout, hardware=profile.stem, notes=notes)


def _fits_context(requests: list[BenchRequest], context: object, spec: ModelSpec) -> None:
    """NotModelled where a request is longer than the context the launch served (its own setting where
    it published one, else the model's)."""
    longest = max(r.input_len + r.output_len for r in requests)
    if longest > (context if isinstance(context, int) else spec.max_context_length):
        raise NotModelled(f"a request of {longest:,} tokens exceeds the served context")


def _vllm_plan(entry: Entry, model_dir: Path, profile: Path, calibration: str | None,
               notes: list[str]) -> Plan:
    """A vLLM entry's plan: its launch as the simulated engine playing vLLM takes it, its requests as for
    any entry."""
    spec = load_model_spec(str(model_dir))
    requests, cap = _requests(entry, model_dir, spec, notes)
    _fits_context(requests, entry.server_args.get("max_model_len"), spec)
    if entry.disaggregation is not None:
        return _vllm_disaggregated(entry, model_dir, profile, calibration, requests, cap, notes, spec.is_moe)
    argv, launch_notes = vllm_argv(entry, model_dir, profile, calibration)
    notes += launch_notes
    p = entry.parallelism
    family = "pp" if p.pp > 1 else "moe" if spec.is_moe else "dense"
    return Plan(argv=argv, env={}, requests=requests, max_concurrency=cap, family=family,
                layout="EP" if p.ep > 1 else "TP", hardware=profile.stem, notes=notes)


def _vllm_disaggregated(entry: Entry, model_dir: Path, profile: Path, calibration: str | None,
                        requests: list[BenchRequest], cap: int | None, notes: list[str], moe: bool) -> Plan:
    """A disaggregated vLLM run's plan: each role's ``vllm serve`` (its DP ranks of TP ``tp / attention``,
    the experts spread where ``ep`` > 1) with NIXL's connector, every server within one node, prefill
    servers first."""
    d = entry.disaggregation
    assert d is not None
    _place(entry, [d.prefill.tp] * d.prefill.workers + [d.decode.tp] * d.decode.workers, profile)

    def role_argv(name: str, role: Role) -> list[str]:
        dp = role.attention
        one = entry.model_copy(update={
            "parallelism": entry.parallelism.model_copy(update={"tp": role.tp // dp, "dp": dp,
                                                                "ep": role.tp if role.ep > 1 else 1}),
            "server_args": {**entry.server_args, **role.server_args}})
        argv, launch_notes = vllm_argv(one, model_dir, profile, calibration)
        notes.extend(n for n in launch_notes if n not in notes)
        played = argv[argv.index("--sim-vllm-release") + 1]  # NIXL's connector as that release runs it
        return [*argv, "--kv-transfer-config", kv_transfer_config(name, played)]

    roles = Roles(role_argv("prefill", d.prefill), role_argv("decode", d.decode), d.prefill.workers,
                  d.decode.workers)
    layout = DISAGGREGATED + (" DP" if max(d.prefill.attention, d.decode.attention) > 1 else "")
    return Plan(argv=roles.decode_argv, env={}, requests=requests, max_concurrency=cap,
                family="moe" if moe else "dense", layout=layout, hardware=profile.stem, notes=notes,
                roles=roles)


def _place(entry: Entry, servers: list[int], profile: Path) -> None:
    """NotModelled where a server is wider than a node of ``profile`` or the servers, placed in order,
    need more nodes than the run published."""
    per_node = load_hardware(str(profile)).num_gpus
    if max(servers) > per_node:
        raise NotModelled(f"a server of {max(servers)} GPUs is wider than a node of {per_node}")
    nodes = place_servers(servers, per_node)[-1] + 1
    if nodes > entry.nodes:
        raise NotModelled(f"its servers take {nodes} nodes of {per_node} GPUs; {entry.nodes} published")


def _disaggregated(entry: Entry, base: list[str], requests: list[BenchRequest], cap: int | None,
                   env: dict[str, str], notes: list[str], moe: bool, profile: Path) -> Plan:
    """A disaggregated run's plan: each role's servers with their own layout and flags (over the run's
    ``server_args``), every server within one node of the profile, prefill servers first."""
    d = entry.disaggregation
    assert d is not None
    _place(entry, [d.prefill.tp] * d.prefill.workers + [d.decode.tp] * d.decode.workers, profile)

    def role_argv(name: str, role: Role) -> list[str]:
        ranks = ["--attn-dp-size", str(role.attention)] if role.attention > 1 else []
        return [*base, "--tp-size", str(role.tp), "--ep-size", str(role.ep), *ranks,
                "--disaggregation-mode", name, "--disaggregation-transfer-backend", d.transfer_backend,
                *_flags({**entry.server_args, **role.server_args})]

    roles = Roles(role_argv("prefill", d.prefill), role_argv("decode", d.decode), d.prefill.workers,
                  d.decode.workers)
    layout = DISAGGREGATED + (" attention DP" if max(d.prefill.attention, d.decode.attention) > 1 else "")
    return Plan(argv=roles.decode_argv, env=env, requests=requests, max_concurrency=cap,
                family="moe" if moe else "dense", layout=layout, hardware=profile.stem, notes=notes,
                roles=roles)


def predict(entry: Entry) -> tuple[Plan, dict[str, float]]:
    """``entry`` replayed: its plan and the benchmark's numbers as the simulated engine predicts them.
    Raises :class:`NotModelled` for what cannot be modelled (including flags the engine refuses)."""
    with tempfile.TemporaryDirectory(prefix="parasweep-fidelity-") as tmp:
        p = plan(entry, Path(tmp))
        try:
            with engine_env(p.env):
                trial = (load_layout(p.roles.prefill_argv, p.roles.decode_argv, p.roles.prefill_workers,
                                     p.roles.decode_workers).fresh()
                         if p.roles else VirtualTrial(load_config(p.argv)))
        except ValueError as e:
            raise NotModelled(f"the simulated engine refuses this launch: {e}") from None
    records = replay_on(trial, p.requests, p.max_concurrency)
    metrics = bench_metrics(records)
    if _single_request(entry) and records[0].end_time is not None and records[0].send_time is not None:
        e2e = records[0].end_time - records[0].send_time
        metrics["ttft_s"] = metrics["mean_ttft_ms"] / 1000.0
        # a speed benchmark's tokens per second: prompt and output tokens over the request's time
        metrics["speed_tok_s"] = (records[0].input_tokens + records[0].output_tokens) / e2e
    return p, metrics
