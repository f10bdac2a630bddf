"""The typed shape of a parasweep configuration.

Hydra composes ``conf/`` onto these dataclasses, so a misspelt key or a wrong type fails at start-up
(OmegaConf struct mode) instead of half-way through a sweep. Cross-field rules (world size vs GPUs,
pp vs layers, ...) live in :mod:`orchestrator.config.validate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from vocab.hardware import HardwareConf, place_servers


@dataclass
class SimFaultConf:
    """Faults the simulated engine injects on purpose (tests and drills of parasweep's own failure
    handling). Passed as ``--sim-fault-*`` flags to the simulated engine only; a trial on any other
    engine with one of these set is refused before anything launches."""

    crash_after_requests: int | None = None  # the process dies when this many requests have arrived
    hang_before_ready: bool = False  # /health never reports ready
    startup_delay_s: float = 0.0  # slow start: ready only after this long
    hang_after_requests: int | None = None  # the engine stops producing tokens (a deadlock) from then on
    stall_stream_fraction: float = 0.0  # this fraction of streams stops mid-way (server stays alive)
    http_error_fraction: float = 0.0  # this fraction of requests is answered with HTTP 500
    malformed_sse_fraction: float = 0.0  # this fraction of streams carries a malformed SSE event
    cut_stream_fraction: float = 0.0  # this fraction of streams has its connection cut mid-way
    oom_at_start: bool = False  # start-up fails with CUDA out of memory, logged the way SGLang logs it


@dataclass
class EngineConf:
    # "auto" picks sglang where a GPU and SGLang are present, else the simulated engine; "sglang" and
    # "vllm" run that engine, played by the simulated engine where this node has no GPU and none are
    # declared (ray.num_gpus, a Ray cluster); "sim" is the simulated engine playing SGLang anywhere
    name: str = "auto"
    python: str | None = None  # interpreter that runs the engine (null: the one running parasweep)
    startup_timeout_s: float = 900.0  # readiness deadline; the failure message carries the log tail
    stop_grace_s: float = 10.0  # SIGTERM to the process group, then SIGKILL after this long
    # simulated engine only: simulated seconds per wall second; the trial is timed on the engine's own
    # clock, so its numbers do not change with it (conf/engine/auto.yaml and sim.yaml play at 4)
    time_scale: float = 1.0
    sim_faults: SimFaultConf = field(default_factory=SimFaultConf)  # simulated engine only


@dataclass
class ModelConf:
    name: str = "???"
    path: str = "???"  # HF config directory; relative paths are relative to the project root
    load_format: str = "dummy"  # real SGLang: random weights, no download
    # where the real weights are (a Hugging Face id or a local folder): only for the command a search
    # prints to serve the model for real; parasweep itself never downloads or loads them
    weights: str | None = None
    skip_tokenizer_init: bool = True  # drive /generate with input_ids; no tokenizer files needed
    # config.json fields to override, e.g. {num_hidden_layers: 4} to shrink a model for a smoke test
    override_args: dict[str, Any] = field(default_factory=dict)
    # draft models for speculative decoding, by spec.algorithm: config folders like the model's own
    drafts: dict[str, str] = field(default_factory=dict)


@dataclass
class TPConf:
    size: int = 1


@dataclass
class PPConf:
    size: int = 1
    async_depth: int = 0  # --pp-async-batch-depth
    micro_batch_size: int | None = None  # --pp-max-micro-batch-size (null: engine default)


@dataclass
class EPConf:
    size: int = 1
    # how a MoE layer reaches the experts of other GPUs (--moe-a2a-backend): none (the tokens gathered
    # to every GPU of the TP group) or an all-to-all backend such as deepep (each token sent to the GPUs
    # holding its experts; SGLang then sets ep.size to tp.size); the choices are each release's own
    a2a_backend: str = "none"
    # --deepep-mode: auto (normal kernels for prefill batches, low_latency for decode) | normal | low_latency
    deepep_mode: str = "auto"
    eplb: bool = False  # --enable-eplb: experts moved between GPUs so each gets an even share of tokens
    redundant_experts: int = 0  # --ep-num-redundant-experts: extra copies of the busiest experts
    # --enable-two-batch-overlap: each forward split in two, one half's all-to-all beside the other's
    # compute (launched on SGLang; the simulated engine does not model it and says so)
    two_batch_overlap: bool = False


@dataclass
class DPConf:
    size: int = 1
    # attention data parallelism: ranks inside each engine's TP group, each with its own requests, KV
    # cache and scheduler for the attention blocks, all meeting at the experts; adds no GPUs (SGLang
    # --attn-dp-size, before 0.5.22 --enable-dp-attention with --dp-size; docs/attention-dp.md)
    attention: int = 1
    # how requests are spread over the replicas or attention-DP ranks: round_robin (SGLang's DP
    # controller), total_requests (the controller sends each to the one holding fewest requests) or
    # cache_aware (the sglang-router package's policy: a replica that already holds the prompt's prefix)
    router: str = "round_robin"
    # who runs it: auto | engine | smg (the router package as its own process in front of dp.size
    # servers; auto picks it for cache_aware on SGLang, whose DP controller has no such policy)
    router_impl: str = "auto"


@dataclass
class SpecConf:
    """Speculative decoding (``spec=<name>``, ``conf/spec/``; docs/speculative.md): a draft proposes
    tokens and the target verifies them in one forward."""

    # none | eagle | eagle3 | mtp (the model's own next-token layers; SGLang's NEXTN) | standalone | ngram
    algorithm: str = "none"
    # null: SGLang's own choice for the model's architecture (Llama: 5, 4, 8; most others: 3, 1, 4)
    num_steps: int | None = None  # draft depth
    topk: int | None = None  # branches per draft step
    num_draft_tokens: int | None = None  # tree tokens the target verifies per request
    # the draft's config folder; null: the model's own (model.drafts.<algorithm>, or its MTP layers)
    draft_model: str | None = None
    draft_load_format: str | None = None  # null: as model.load_format
    # how many drafted tokens the target accepts, for the simulated engine and predictions: auto (the
    # published accept lengths of the draft kind on the workload's kind of text), a mean accept length
    # (tokens per request per verify, SGLang's "accept len"), or per-position rates [p1, p2, ...]
    acceptance: Any = "auto"


@dataclass
class PDRoleConf:
    """One role of a disaggregated deployment (``pd.prefill``, ``pd.decode``): how many servers play it and
    each server's layout and knobs. A null takes the trial's own value (``tp.size``, ``server.*``)."""

    workers: int = 1
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    dp: int | None = None
    attention: int | None = None  # attention-DP ranks of each server of the role (dp.attention)
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    extra_args: dict[str, Any] = field(default_factory=dict)  # over server.extra_args, for this role only


@dataclass
class PDConf:
    """Prefill/decode disaggregation (``pd=<name>``, ``conf/pd/``; docs/disaggregation.md): prefill servers
    and decode servers, the KV moved between them, the router in PD mode in front."""

    enabled: bool = False
    prefill: PDRoleConf = field(default_factory=PDRoleConf)
    decode: PDRoleConf = field(default_factory=PDRoleConf)
    transfer_backend: str = "mooncake"  # --disaggregation-transfer-backend: mooncake | nixl | mooncake_tcp
    # each prefill server's bootstrap port: this and the next ones, one per prefill server (null: a free
    # port each; SGLang's own default, 8998, fits one prefill server per host)
    bootstrap_port: int | None = None
    reserved_decode_tokens: int | None = None  # --num-reserved-decode-tokens (null: the engine's, 512)
    policy: str = "round_robin"  # how the router pairs a prefill and a decode server: round_robin | random
    # set for one server by the launcher, not for users: its role (prefill | decode) and the node of the
    # deployment it sits on (which decides whether its KV crosses the network)
    role: str = ""
    node: int = 0


@dataclass
class ServerConf:
    max_running_requests: int | None = None
    cuda_graph: bool = True
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    # null: chosen coprime with pp.size + pp.async_depth so PP log lines do not always show one slot
    decode_log_interval: int | None = None
    random_seed: int = 0
    radix_cache: bool = True  # false: --disable-radix-cache (no prefix is kept between requests)
    schedule_policy: str = "fcfs"  # --schedule-policy: fcfs | lpm | dfs-weight | lof | random | priority
    extra_args: dict[str, Any] = field(default_factory=dict)  # further engine flags: {flag-name: value}


@dataclass
class SharedPrefixConf:
    groups: int = 16
    prompts_per_group: int = 8
    system_len: int = 2048  # tokens of each group's system prompt
    question_len: int = 128  # tokens of each request's own question
    output_len: int = 256
    zipf: float | None = None  # null: every group equally often; s > 0: group k drawn ~ 1 / (k + 1) ** s


@dataclass
class PredictedPointConf:
    """How long a point runs in virtual time (``predict=true``, the ``(pred)`` column, the advice's and
    the search's predictions): not the request count a measurement can afford, but until its
    throughput is known to ``ci_target`` and its TTFT and ITL p99 to ``latency_ci_target`` (the
    relative half-widths of their 95 % intervals), or until ``budget_s`` seconds of the engine's
    virtual time of measured sends have passed, whichever comes first. A point that reaches the budget
    first says so (docs/loadgen.md, "Predicted points"). A p99 needs far more requests than a mean
    rate for the same width (some 1,800 for ±10 % where the tail is exponential), hence its own,
    looser target."""

    ci_target: float = 0.02
    latency_ci_target: float = 0.10
    # the changes a diagnosis, the end of a sweep and a search predict by the dozen: each on the same
    # footing, its throughput to this fraction (the verdicts call a change worth making at +5 %), and
    # each carrying its own intervals to say how sure it is
    candidate_ci_target: float = 0.05
    budget_s: float = 60.0


@dataclass
class WorkloadConf:
    name: str = "custom"
    api: str = "generate"  # generate | completions | chat
    # where requests come from: random (token ids of input_len / output_len), sharegpt (conversations),
    # mooncake or azure (timed traces); docs/workloads.md
    source: str = "random"
    dataset_path: str | None = None  # the source's file (null: the copy parasweep ships or installs)
    tokenizer: str = "auto"  # ShareGPT's text -> ids: auto | quicktok:<encoding> | a tokenizer.json path
    multi_turn: bool = False  # sharegpt: each point's streams are sessions sending their turns in order
    think_time_s: float = 0.0  # multi-turn: seconds between an answer and the session's next question
    block_size: int = 512  # mooncake: prompt tokens per hash id
    # shared-prefix: groups of requests sharing a system prompt (SGLang's generated-shared-prefix)
    shared_prefix: SharedPrefixConf = field(default_factory=SharedPrefixConf)
    trace_start_s: float = 0.0  # traces: the window replayed, from the trace's first arrival
    trace_window_s: float | None = None  # null: to the end of the trace
    # arrival=trace: one load point per speed factor (2: twice as fast as recorded)
    trace_speed: list[float] = field(default_factory=lambda: [1.0])
    concurrency: list[int] = field(default_factory=list)  # closed-loop load points (multi-turn: sessions)
    rate: list[float] = field(default_factory=list)  # open-loop load points, req/s
    arrival: str = "poisson"  # open loop: poisson | gamma:CV | constant | trace (the trace's own times)
    input_len: int = 256
    output_len: int = 64
    # each request's lengths around input_len / output_len (their means): fixed | uniform:R |
    # normal:CV | exponential | lognormal:SIGMA; samples are clipped to fit the model's context
    input_dist: str = "fixed"
    output_dist: str = "fixed"
    # null: each point sends max(8, requests_per_concurrency x C) requests (open loop: x rate)
    requests_per_point: int | None = None
    requests_per_concurrency: int = 4
    warmup_requests: int = 2
    # closed loop: warm-up requests per stream instead (1: the opening wave of C simultaneous requests
    # is warm-up, and with fixed lengths the measured requests then fill whole waves); null: the count
    warmup_per_concurrency: float | None = None
    # closed loop: how the C streams enter. "auto": one by one over the point's predicted mean request
    # duration (the simulator's model, in virtual time), so fixed lengths do not march in step; a
    # number: over that many seconds; 0: all at once (a burst test)
    ramp: Any = "auto"
    # stop a point once its throughput's 95 % confidence interval is within this fraction of its mean
    # (the request count, and max_point_s, are then upper bounds); null: always the whole count
    ci_target: float | None = 0.03
    # measured sends stop after this long, in the engine's seconds (a simulated engine played at
    # engine.time_scale counts its own); null: the count decides
    max_point_s: float | None = None
    # in virtual time a point runs until its numbers are known, not for the request count above
    predicted: PredictedPointConf = field(default_factory=PredictedPointConf)
    seed: int = 0
    # a request that receives nothing for this long fails as stalled (the point goes on); timed on the
    # records' clock, so a simulated engine at engine.time_scale counts its own seconds
    stall_timeout_s: float = 300.0
    # a point still sending after this long (wall seconds from its first request: a guard on the
    # processes; the client's set-up before that does not count) is ended: its
    # finished records are kept, the rest are recorded as timed out, and the trial fails (null: no
    # limit beyond stall_timeout_s)
    point_timeout_s: float | None = 3600.0


@dataclass
class CalibrationConf:
    """A calibration profile of the simulated engine's cost model (``conf/calibration/<name>.yaml``,
    written by ``python -m orchestrator calibrate``): fitted constants, each with its source. Used by
    the simulated engine and by predictions; ``calibration=null`` (the default) is the uncalibrated
    model."""

    name: str | None = None
    hardware: str | None = None  # the hardware profile it was fitted for
    source: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # cost-model constants: {value, source}
    hardware_overrides: dict[str, Any] = field(default_factory=dict)  # hardware fields: {value, source}
    # speculative decoding: draft kind -> {value: per-position acceptance, source} measured by a run
    spec_acceptance: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)  # residuals and held-out errors


@dataclass
class SimulatorConf:
    """The simulator's model, wherever it runs: the simulated engine, ``predict=true``, the ``pred/``
    metrics and every suggestion's predicted effect."""

    # what prices each step's kernels: "measured" (kernel tables of the hardware profile's GPU, from
    # aiconfigurator-core), "roofline" (bandwidth and compute peaks with fitted efficiencies), or "auto"
    # (measured where the profile names tables and the package is installed, else the roofline)
    step_costs: str = "auto"


@dataclass
class SearchConf:
    """A search of layouts and knobs in prediction (``search=<name>``, ``conf/search/``; docs/search.md).

    Each ``space`` entry is a config key and its values in Hydra's sweep syntax
    (``tp.size=choice(1,2,4,8)``, ``pp.async_depth=range(0,17,4)``, ``pp.size=1,2,4``,
    ``+server.extra_args.enable-mixed-chunk=true,false``); every combination is a candidate. Each valid
    candidate is predicted at closed-loop concurrencies up to ``max_concurrency`` to find the highest
    load that meets every ``slo`` (metric -> upper bound, e.g. ``ttft_p99_ms: 2000``), and ranked by
    ``objective`` there."""

    name: str | None = None  # null: no search (a trial or a sweep)
    space: list[str] = field(default_factory=list)
    objective: str = "output_tok_s_per_gpu"  # | goodput_req_s_per_gpu
    slo: dict[str, float] = field(default_factory=dict)
    max_concurrency: int = 256
    workers: int | None = None  # processes predicting candidates (null: one per CPU)
    measure_top: int = 3  # the best this many predicted are measured as trials (0: predict only)
    # a larger space is not enumerated: Optuna's TPE sampler picks this many candidates of it
    max_candidates: int = 2000
    seed: int = 0  # the sampler's seed


@dataclass
class TelemetryConf:
    # GPU samples per second during a trial (NVML on a GPU node, the simulated engine's model
    # otherwise); 0 turns GPU sampling off
    gpu_hz: float = 10.0
    metrics_period_s: float = 1.0  # how often the engine's /metrics is scraped


@dataclass
class ReportConf:
    # what the end of a sweep draws and writes beside its summary table (the numbers are in the store
    # either way; `python -m analysis report RUN_ID` writes the HTML report later)
    plots: bool = True  # each trial's plots into its run and directory, every trial on one chart
    html: bool = True  # report.html in the sweep's directory and as the sweep run's artifact


@dataclass
class TrackingConf:
    uri: str | None = None  # null: sqlite file runs/mlflow.db under the working directory
    experiment: str = "parasweep"
    # set by the launcher for each trial of a sweep (not for users):
    parent_run_id: str | None = None  # the sweep's run
    label: str | None = None  # the trial's overrides that vary between the sweep's trials
    engine_reason: str | None = None  # why the trial runs on its engine (engine=auto's choice, ...)


# the engine names of a trial that runs vLLM, or the simulated engine playing it
VLLM_ENGINES = ("vllm", "sim-vllm")


def plays_vllm(cfg: ParasweepConf) -> bool:
    """The trial runs vLLM, or the simulated engine playing it (``engine.name`` as asked, or as resolved:
    ``sim-vllm`` where no GPU is)."""
    return cfg.engine.name in VLLM_ENGINES


def world_size(cfg: ParasweepConf) -> int:
    """The GPUs a trial takes: its layout's, or with disaggregation every prefill and decode server's."""
    if cfg.pd.enabled and not cfg.pd.role:
        return sum(role_gpus(cfg, role) * getattr(cfg.pd, role).workers for role in PD_ROLES)
    return cfg.tp.size * cfg.pp.size * cfg.dp.size


PD_ROLES = ("prefill", "decode")


def role_gpus(cfg: ParasweepConf, role: str) -> int:
    """The GPUs one server of ``role`` takes."""
    r = getattr(cfg.pd, role)
    return (r.tp or cfg.tp.size) * (r.pp or cfg.pp.size) * (r.dp or cfg.dp.size)


def worker_config(cfg: ParasweepConf, role: str, index: int,
                  bootstrap_port: int | None = None) -> ParasweepConf:
    """The configuration of server ``index`` of ``role``: the role's, on its node of the deployment, a
    prefill server with its own bootstrap port (``pd.bootstrap_port`` plus its index unless given)."""
    from dataclasses import replace

    one = role_config(cfg, role)
    node = server_nodes(cfg)[index if role == "prefill" else cfg.pd.prefill.workers + index]
    if role == "prefill" and bootstrap_port is None and cfg.pd.bootstrap_port is not None:
        bootstrap_port = cfg.pd.bootstrap_port + index
    return replace(one, pd=replace(one.pd, node=node, bootstrap_port=bootstrap_port))


def bootstrap_ports(cfg: ParasweepConf, fallback: Callable[[int], int]) -> list[int]:
    """Each prefill server's bootstrap port: ``pd.bootstrap_port`` and the next ones, else
    ``fallback(index)`` (a free port for a trial, SGLang's default and up for a printed command)."""
    first = cfg.pd.bootstrap_port
    return [first + i if first is not None else fallback(i) for i in range(cfg.pd.prefill.workers)]


def server_nodes(cfg: ParasweepConf) -> list[int]:
    """The node of each server of a disaggregated deployment, prefill servers first."""
    gpus = [role_gpus(cfg, role) for role in PD_ROLES for _ in range(getattr(cfg.pd, role).workers)]
    return place_servers(gpus, cfg.hardware.num_gpus)


def role_config(cfg: ParasweepConf, role: str) -> ParasweepConf:
    """The configuration one server of ``role`` is started with: the trial's, with the role's layout and
    knobs where it sets them, marked with its role. Both roles' layouts are written out in ``pd`` (no
    null left), so a role's server knows its peer's (SGLang 0.5.9 is told the decode side's TP)."""
    from dataclasses import replace

    def resolved(r: PDRoleConf) -> PDRoleConf:
        return replace(r, tp=r.tp or cfg.tp.size, pp=r.pp or cfg.pp.size, ep=r.ep or cfg.ep.size,
                       dp=r.dp or cfg.dp.size, attention=r.attention or cfg.dp.attention)

    pd = replace(cfg.pd, prefill=resolved(cfg.pd.prefill), decode=resolved(cfg.pd.decode), role=role)
    r = getattr(pd, role)
    server = replace(cfg.server, extra_args={**cfg.server.extra_args, **r.extra_args},
                     **{k: getattr(r, k) for k in ("max_running_requests", "chunked_prefill_size",
                                                   "mem_fraction_static") if getattr(r, k) is not None})
    return replace(cfg, tp=replace(cfg.tp, size=r.tp), ep=replace(cfg.ep, size=r.ep),
                   pp=replace(cfg.pp, size=r.pp, async_depth=cfg.pp.async_depth if r.pp > 1 else 0),
                   dp=replace(cfg.dp, size=r.dp, attention=r.attention), server=server, pd=pd)


def router_process(cfg: ParasweepConf, engine: str) -> bool:
    """Whether the trial runs the router package as its own process in front of one server per DP
    replica (``dp.router_impl``; ``auto``: for ``cache_aware`` on SGLang, whose DP controller has no
    such policy). ``engine`` is the resolved engine, sim or sglang."""
    if cfg.dp.size < 2 or cfg.dp.router_impl == "engine":
        return False
    return cfg.dp.router_impl == "smg" or (engine == "sglang" and cfg.dp.router == "cache_aware")


def trial_nodes(cfg: ParasweepConf) -> int:
    """The nodes a trial spans: its world size over the GPUs of one node of its hardware profile."""
    return max(1, -(-world_size(cfg) // max(1, cfg.hardware.num_gpus)))


def gpus_per_node(cfg: ParasweepConf) -> int:
    """The GPUs a trial takes on each of its nodes (its world size on one node; across nodes, whole
    nodes of its hardware profile, as validation requires)."""
    return world_size(cfg) // trial_nodes(cfg)


def joins_cluster(address: str | None) -> bool:
    """Whether ``ray.address`` names a cluster to join ("auto", host:port); null, "" and "local" all
    mean the sweep's own local Ray instance."""
    return address not in (None, "", "local")


@dataclass
class RayConf:
    address: str | None = None  # null: start a local Ray; "auto" or host:port joins a cluster
    num_gpus: int | None = None  # GPUs to declare for a local Ray (null: detected, or the sim node)
    num_cpus: int | None = None  # CPUs for a local Ray (null: enough for one trial per GPU)
    cpus_per_trial: float = 1.0
    accelerator_type: str | None = None  # Ray accelerator type every trial needs, e.g. "H200"


# Keys that configure a sweep as a whole, not one trial: they may not vary between a sweep's trials
# (the launcher refuses that) and never appear in a trial's label.
SWEEP_WIDE_KEYS = ("tracking.uri", "tracking.experiment", "ray.address", "ray.num_gpus", "ray.num_cpus",
                   "resume", "dry_run", "predict", "reproduce", "repeats")


@dataclass
class VLLMConf:
    """vLLM's own knobs (``vllm.*``; docs/vllm-adapter.md): set only with ``engine=vllm``, where each
    becomes its flag, checked against the release; null leaves vLLM's default. What both engines share
    (layout, caps, memory, prefix caching) is configured in their common groups."""

    async_scheduling: bool | None = None  # --async-scheduling: the next step scheduled while this one runs
    block_size: int | None = None  # --block-size: tokens per KV-cache block
    scheduling_policy: str | None = None  # --scheduling-policy: fcfs | priority
    long_prefill_token_threshold: int | None = None  # --long-prefill-token-threshold: a "long" prompt
    max_num_partial_prefills: int | None = None  # --max-num-partial-prefills: prompts chunked at once
    moe_backend: str | None = None  # --moe-backend: the fused-MoE kernels (auto: vLLM's choice per GPU)
    # the recorded release a command line is checked against where vLLM is not installed here, and the
    # one the simulated engine plays (null: the newest recorded); not a flag
    release: str | None = None


@dataclass
class ParasweepConf:
    engine: EngineConf = field(default_factory=EngineConf)
    model: ModelConf = field(default_factory=ModelConf)
    hardware: HardwareConf = field(default_factory=HardwareConf)
    calibration: CalibrationConf = field(default_factory=CalibrationConf)
    simulator: SimulatorConf = field(default_factory=SimulatorConf)
    tp: TPConf = field(default_factory=TPConf)
    pp: PPConf = field(default_factory=PPConf)
    ep: EPConf = field(default_factory=EPConf)
    dp: DPConf = field(default_factory=DPConf)
    server: ServerConf = field(default_factory=ServerConf)
    spec: SpecConf = field(default_factory=SpecConf)
    pd: PDConf = field(default_factory=PDConf)
    vllm: VLLMConf = field(default_factory=VLLMConf)
    workload: WorkloadConf = field(default_factory=WorkloadConf)
    telemetry: TelemetryConf = field(default_factory=TelemetryConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    report: ReportConf = field(default_factory=ReportConf)
    ray: RayConf = field(default_factory=RayConf)
    search: SearchConf = field(default_factory=SearchConf)
    dry_run: bool = False  # print each trial's plan and server argv, launch nothing
    predict: bool = False  # run the simulator's model in virtual time instead of launching anything
    # sweeps: skip trials whose resolved config already succeeded in this experiment (false: run all)
    resume: bool = True
    reproduce: str | None = None  # an MLflow run id: re-run that trial or sweep (orchestrator/reproduce.py)
    # sweeps: run every trial this many times, each on a fresh engine (a sweep dimension repeat=0..N-1;
    # the summary, the report and compare aggregate the repeats: median and 95 % interval)
    repeats: int = 1
    repeat: int = 0  # which repeat this trial is (set by the launcher)


# Mappings whose keys are the user's to choose: ``search.slo={ttft_mean_ms: 1000}`` on the command line
# may name any metric (validation checks them), where the rest of the schema refuses unknown keys
OPEN_MAPPINGS = ("search.slo",)


def register_configs() -> None:
    """Make the schema known to Hydra; ``conf/config.yaml`` lists ``parasweep_schema`` first."""
    node = OmegaConf.structured(ParasweepConf)
    for path in OPEN_MAPPINGS:
        OmegaConf.set_struct(OmegaConf.select(node, path), False)
    ConfigStore.instance().store(name="parasweep_schema", node=node)
