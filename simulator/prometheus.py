"""Prometheus exposition on a private ``CollectorRegistry``: SGLang's ``sglang:`` series and the
simulator's own ``parasweep_sim:`` series (names and labels: docs/simulator.md, "Metrics").

Scheduler series carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` (+ ``dp_rank`` when
dp>1), one set per PP stage as SGLang exports from each stage's attn_tp_rank 0. Their values are those
the stage last *reported* (at a decode-log or prefill batch), like SGLang's gauges. Tokenizer-level
histograms and counters use simulated seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from simulator.entities import PDQueues
from simulator.gpus import power_w

if TYPE_CHECKING:
    from simulator.replica import ReplicaModel
    from simulator.sim_config import SimConfig
    from simulator.speculative.params import SpecParams

# SGLang's default buckets (observability/metrics_collector.py).
# SGLang 0.5.23's buckets of a prefill server's KV transfer histograms (observability/metrics_collector.py)
KV_TRANSFER_MS_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000]
KV_TRANSFER_MB_BUCKETS = [1, 5, 10, 50, 100, 500, 1000, 5000, 10000]
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
# SGLang 0.5.23's scheduler histograms of a request's timeline (observability/metrics_collector.py):
# the wait in the waiting queue, and each stage's latency (exponential_buckets(0.001, 1.62, 30))
QUEUE_TIME_BUCKETS = [0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40,
                      50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400,
                      1600, 1800, 2000, 2500, 3000]
STAGE_BUCKETS = [0.001 * 1.62 ** i for i in range(30)]
# SGLang 0.5.23's attention-DP balance histograms (observability/metrics_collector.py)
IMBALANCE_RATIO_BUCKETS = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0]
SYNC_WAIT_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
               1800, 2400]


class StageGauges:
    """What one replica's stages last reported (identical on every stage: SGLang's replicated state)."""

    __slots__ = ("cache_hit_rate", "cuda_graph", "gen_throughput", "num_queue", "num_running", "num_used",
                 "spec_accept_length", "spec_accept_rate", "token_usage")

    def __init__(self) -> None:
        self.cache_hit_rate = 0.0  # of the last prefill batch (SGLang's gauge is not cumulative)
        self.num_running = 0
        self.num_queue = 0
        self.num_used = 0
        self.token_usage = 0.0
        self.gen_throughput = 0.0
        self.cuda_graph = False
        # speculative decoding: the last decode log interval's (gauges set at the log tick, as SGLang's)
        self.spec_accept_length = 0.0
        self.spec_accept_rate = 0.0


class PrometheusMetrics:
    """The registry ``GET /metrics`` serves, and the tokenizer-level series the ``Reporter`` feeds."""

    def __init__(self, cfg: SimConfig, replicas: list[ReplicaModel], now: Callable[[], float],
                 lag: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.registry = CollectorRegistry(auto_describe=False)
        self.gauges = [StageGauges() for _ in replicas]
        model = cfg.served_model_name
        tok_labels = ["model_name", "engine_type", "is_streaming"]
        reg = self.registry
        ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token (simulated seconds).",
                         tok_labels, buckets=TTFT_BUCKETS, registry=reg)
        e2e = Histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency (simulated s).",
                        tok_labels, buckets=E2E_BUCKETS, registry=reg)
        itl = Histogram("sglang:inter_token_latency_seconds", "Inter-token latency (simulated seconds).",
                        ["model_name", "engine_type"], buckets=ITL_BUCKETS, registry=reg)
        prompt = Counter("sglang:prompt_tokens", "Prefill tokens processed.", tok_labels, registry=reg)
        gen = Counter("sglang:generation_tokens", "Generation tokens processed.", tok_labels, registry=reg)
        nreq = Counter("sglang:num_requests", "Requests finished.", tok_labels, registry=reg)
        # counted per finished request with a cache hit, as SGLang's tokenizer manager does; the
        # simulated cache is all device memory (no host or storage tier)
        cached = Counter("sglang:cached_tokens", "Prompt tokens found in the prefix cache.",
                         ["model_name", "engine_type", "cache_source"], registry=reg)
        self.cached_tokens = cached.labels(model, "unified", "device")
        # Bind label children once: the per-token path then costs one observe().
        self.itl = itl.labels(model, "unified")
        self.ttft = {s: ttft.labels(model, "unified", str(s).lower()) for s in (True, False)}
        self.e2e = {s: e2e.labels(model, "unified", str(s).lower()) for s in (True, False)}
        self.prompt_tokens = {s: prompt.labels(model, "unified", str(s).lower()) for s in (True, False)}
        self.gen_tokens = {s: gen.labels(model, "unified", str(s).lower()) for s in (True, False)}
        self.num_requests = {s: nreq.labels(model, "unified", str(s).lower()) for s in (True, False)}
        # disaggregation: a prefill server's KV transfers, as SGLang 0.5.23's histograms (per GPU bytes)
        scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        latency = Histogram("sglang:kv_transfer_latency_ms", "KV transfer latency (simulated ms).",
                            scheduler, buckets=KV_TRANSFER_MS_BUCKETS, registry=reg)
        total = Histogram("sglang:kv_transfer_total_mb", "KV transferred per request (MiB per GPU).",
                          scheduler, buckets=KV_TRANSFER_MB_BUCKETS, registry=reg)
        self.kv_transfer_latency_ms = latency.labels(model, "unified", "0", "0", "0")
        self.kv_transfer_total_mb = total.labels(model, "unified", "0", "0", "0")
        # a disaggregated server's request timeline: its queue wait and the PD stages it observes (a
        # labelled child appears at its first observation, as SGLang's do)
        queue = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds (simulated).",
                          scheduler, buckets=QUEUE_TIME_BUCKETS, registry=reg)
        stages = Histogram("sglang:per_stage_req_latency_seconds",
                           "The latency of each stage of requests (simulated seconds).",
                           [*scheduler, "stage"], buckets=STAGE_BUCKETS, registry=reg)
        self.queue_time = queue.labels(model, "unified", "0", "0", "0")
        self.stage_latency = lambda stage: stages.labels(model, "unified", "0", "0", "0", stage)
        # attention DP: the busiest rank's tokens over the mean, per forward (observed by rank 0), and
        # each rank's wait for the slowest at the exchange of batch sizes; SGLang 0.5.23's buckets
        if cfg.attn_dp > 1:
            rank = [*scheduler, "dp_rank"]
            ratio = Histogram("sglang:dp_attention_token_imbalance_ratio",
                              "Per MLP-sync step, max tokens over mean tokens across the DP ranks.",
                              rank, buckets=IMBALANCE_RATIO_BUCKETS, registry=reg)
            wait = Histogram("sglang:dp_attention_sync_wait_seconds",
                             "Each DP rank's MLP-sync all-gather per step (simulated seconds).",
                             rank, buckets=SYNC_WAIT_BUCKETS, registry=reg)
            self.dp_imbalance_ratio = ratio.labels(model, "unified", "0", "0", "0", "0")
            self.dp_sync_wait = [wait.labels(model, "unified", str(r * cfg.rank_tp), "0", "0", str(r))
                                 for r in range(cfg.attn_dp)]
        reg.register(_ReplicaCollector(cfg, replicas, self.gauges, now, lag or (lambda: 0.0)))


class _ReplicaCollector(Collector):
    """Scheduler gauges and simulated telemetry, read from the replicas at scrape time."""

    def __init__(self, cfg: SimConfig, replicas: list[ReplicaModel], gauges: list[StageGauges],
                 now: Callable[[], float], lag: Callable[[], float]) -> None:
        self.cfg = cfg
        self.replicas = replicas
        self.gauges = gauges
        self.now = now
        self.lag = lag

    def _rank_labels(self, dp_rank: int, pp_rank: int) -> tuple[list[str], list[str]]:
        names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        values = [self.cfg.served_model_name, "unified", "0", str(pp_rank), "0"]
        if self.cfg.schedulers > 1:
            names.append("dp_rank")
            values.append(str(dp_rank))
        return names, values

    def _dp_balance(self) -> Iterator[Metric]:
        """SGLang 0.5.23's counters of attention-DP balance, per rank (``simulator/lockstep.py`` counts)."""
        names, _ = self._rank_labels(0, 0)
        tokens = CounterMetricFamily("sglang:dp_attention_tokens", "Tokens of MLP-sync steps on this DP rank "
                                     "(scheduled: its own; imbalance: the busiest rank's beyond them).",
                                     labels=[*names, "kind"])
        steps = CounterMetricFamily("sglang:dp_attention_steps", "MLP-sync steps on this DP rank (idle: "
                                    "no tokens of its own, run to keep the collectives in lockstep).",
                                    labels=[*names, "rank_state"])
        for dp_rank, rep in enumerate(self.replicas):
            _, values = self._rank_labels(dp_rank, 0)
            bal = rep.dp_balance
            tokens.add_metric([*values, "scheduled"], bal.scheduled)
            tokens.add_metric([*values, "imbalance"], bal.imbalance)
            steps.add_metric([*values, "active"], bal.active)
            steps.add_metric([*values, "idle"], bal.idle)
        yield from (tokens, steps)

    def _disaggregation(self) -> Iterator[Metric]:
        """SGLang's PD queue gauges (registered by every server, 0 outside a disaggregated role)."""
        names, _ = self._rank_labels(0, 0)
        docs = (("num_prefill_bootstrap_queue_reqs", "bootstrap"),
                ("num_prefill_inflight_queue_reqs", "inflight"),
                ("num_decode_prealloc_queue_reqs", "prealloc"),
                ("num_decode_transfer_queue_reqs", "transfer"))
        families = {field: GaugeMetricFamily(f"sglang:{name}", f"Requests in the {field} queue.",
                                             labels=names) for name, field in docs}
        pending = GaugeMetricFamily("sglang:pending_prealloc_token_usage",
                                    "The token usage for pending preallocated tokens (not preallocated yet).",
                                    labels=names)
        for dp_rank, rep in enumerate(self.replicas):
            q = rep.pd_queues() if rep.pd_queues is not None else PDQueues()
            for pp_rank in range(self.cfg.pp):
                _, values = self._rank_labels(dp_rank, pp_rank)
                for field, family in families.items():
                    family.add_metric(values, getattr(q, field))
                pending.add_metric(values, q.pending_tokens / self.cfg.max_total_num_tokens)
        yield from families.values()
        yield pending

    def _speculative(self, params: SpecParams | None) -> Iterator[Metric]:
        """SGLang's speculative series. Every release sets its gauges at each decode log line, 0 without
        speculation (0.5.23: accept length and rate, the draft's steps and tokens, and DSpark's cap and
        block lengths, which are always 0 here); with speculation also the verify forwards so far and the
        simulated GPU seconds of the iterations by part."""
        names, _ = self._rank_labels(0, 0)
        length = GaugeMetricFamily("sglang:spec_accept_length", "accepted drafts + bonus token per forward",
                                   labels=names)
        rate = GaugeMetricFamily("sglang:spec_accept_rate", "accepted drafts / proposed drafts", labels=names)
        steps = GaugeMetricFamily("sglang:spec_num_steps", "speculative draft steps", labels=names)
        tokens = GaugeMetricFamily("sglang:spec_num_draft_tokens", "speculative draft tokens verified",
                                   labels=names)
        zero = [GaugeMetricFamily(f"sglang:spec_{name}", doc, labels=names) for name, doc in (
            ("cap_length", "DSpark confidence-scheduled verify window (0: no cap scheduled)"),
            ("block_accept_length", "DSpark uncapped full-block accept length"))]
        calls = CounterMetricFamily("sglang:spec_verify_calls", "speculative verify forwards", labels=names)
        dp_names = ["dp_rank"] if self.cfg.schedulers > 1 else []
        busy = CounterMetricFamily("parasweep_sim:spec_busy_seconds",
                                   "SIMULATED GPU seconds of speculative iterations, by part (draft passes, "
                                   "verify, draft extend, tree kernels)", labels=[*dp_names, "part"])
        for dp_rank, (rep, sg) in enumerate(zip(self.replicas, self.gauges, strict=True)):
            for pp_rank in range(self.cfg.pp):
                _, values = self._rank_labels(dp_rank, pp_rank)
                length.add_metric(values, sg.spec_accept_length)
                rate.add_metric(values, sg.spec_accept_rate)
                steps.add_metric(values, params.num_steps if params is not None else 0)
                tokens.add_metric(values, params.num_draft_tokens if params is not None else 0)
                for gauge in zero:
                    gauge.add_metric(values, 0.0)
                if params is not None:
                    calls.add_metric(values, rep.spec_stats.calls)
            if params is not None:
                for part, seconds in rep.spec_stats.seconds.items():
                    busy.add_metric([*([str(dp_rank)] if self.cfg.schedulers > 1 else []), part], seconds)
        yield from (length, rate, *zero, steps, tokens)
        if params is not None:
            yield from (calls, busy)

    def collect(self) -> Iterator[Metric]:
        cfg = self.cfg
        now = self.now()
        names, _ = self._rank_labels(0, 0)
        g = {
            key: GaugeMetricFamily(f"sglang:{key}", doc, labels=names)
            for key, doc in (
                ("num_running_reqs", "Running requests of the micro-batch last reported (per PP stage)."),
                ("num_queue_reqs", "Requests in the waiting queue."),
                ("gen_throughput", "Generation throughput over the last decode-log window (token/s)."),
                ("token_usage", "KV pool usage (fraction)."),
                ("num_used_tokens", "KV pool tokens in use."),
                ("max_total_num_tokens", "KV pool size in tokens."),
                ("cache_hit_rate", "Prefix cache hit rate of the last prefill batch."),
                ("is_cuda_graph", "Whether the last reported decode batch ran as a CUDA graph."),
                ("context_len", "Context length."),
            )
        }
        realtime = CounterMetricFamily("sglang:realtime_tokens", "Tokens processed, by mode.",
                                       labels=[*names, "mode"])
        sim_names = ["pp_rank"] + (["dp_rank"] if cfg.schedulers > 1 else [])
        busy = CounterMetricFamily("parasweep_sim:stage_busy_seconds",
                                   "SIMULATED seconds each PP stage's GPUs were busy (not NVML).",
                                   labels=sim_names)
        busy_ratio = GaugeMetricFamily("parasweep_sim:stage_busy_ratio",
                                       "SIMULATED busy fraction of each PP stage over the last second.",
                                       labels=sim_names)
        power = GaugeMetricFamily("parasweep_sim:gpu_power_watts",
                                  "SIMULATED GPU power: idle + busy fraction x (limit - idle).",
                                  labels=["gpu"])
        dp_names = ["dp_rank"] if cfg.schedulers > 1 else []
        inflight = GaugeMetricFamily("parasweep_sim:microbatches_in_flight",
                                     "Micro-batches launched and not yet back at stage 0.", labels=dp_names)
        running_all = GaugeMetricFamily("parasweep_sim:num_running_reqs_all_slots",
                                        "Running requests summed over all micro-batch slots.",
                                        labels=dp_names)
        slot_reqs = GaugeMetricFamily("parasweep_sim:slot_running_reqs",
                                      "Running requests owned by each micro-batch slot.",
                                      labels=[*dp_names, "slot"])
        steps = CounterMetricFamily("parasweep_sim:forward_steps", "Micro-batch forwards launched, by mode.",
                                    labels=[*dp_names, "mode"])
        hw = cfg.hw
        for dp_rank, (rep, sg) in enumerate(zip(self.replicas, self.gauges, strict=True)):
            dpl = [str(dp_rank)] if cfg.schedulers > 1 else []
            for pp_rank in range(cfg.pp):
                _, values = self._rank_labels(dp_rank, pp_rank)
                g["num_running_reqs"].add_metric(values, sg.num_running)
                g["num_queue_reqs"].add_metric(values, sg.num_queue)
                g["gen_throughput"].add_metric(values, sg.gen_throughput)
                g["token_usage"].add_metric(values, sg.token_usage)
                g["num_used_tokens"].add_metric(values, sg.num_used)
                g["max_total_num_tokens"].add_metric(values, cfg.max_total_num_tokens)
                g["cache_hit_rate"].add_metric(values, sg.cache_hit_rate)
                g["is_cuda_graph"].add_metric(values, 1.0 if sg.cuda_graph else 0.0)
                g["context_len"].add_metric(values, cfg.context_len)
                realtime.add_metric([*values, "prefill_compute"], rep.tokens_prefill_total)
                realtime.add_metric([*values, "prefill_cache"], rep.admission.cached_total)
                realtime.add_metric([*values, "decode"], rep.tokens_decode_total)
                busy.add_metric([str(pp_rank), *dpl], rep.busy[pp_rank].busy_total(now))
                frac = rep.busy[pp_rank].busy_fraction(now)
                busy_ratio.add_metric([str(pp_rank), *dpl], frac)
                watts = power_w(hw, frac)
                for tp_rank in range(cfg.rank_tp):  # an attention-DP rank's own GPUs
                    # SGLang's placement: replica (or rank) offset + pp_rank * tp + tp_rank
                    gpu = dp_rank * cfg.rank_tp * cfg.pp + pp_rank * cfg.rank_tp + tp_rank
                    power.add_metric([str(gpu)], watts)
            inflight.add_metric(dpl, rep.in_flight)
            running_all.add_metric(dpl, rep.num_running)
            for slot in rep.slots:
                slot_reqs.add_metric([*dpl, str(slot.index)], len(slot.reqs))
            steps.add_metric([*dpl, "prefill"], rep.prefill_steps)
            steps.add_metric([*dpl, "decode"], rep.decode_steps)
        yield from g.values()
        yield from self._disaggregation()
        yield from self._speculative(cfg.speculative.params if cfg.speculative is not None else None)
        yield from (realtime, busy, busy_ratio, power, inflight, running_all, slot_reqs, steps)
        if cfg.attn_dp > 1:
            yield from self._dp_balance()
        sim_time = GaugeMetricFamily("parasweep_sim:sim_time_seconds", "Simulated time since start.")
        sim_time.add_metric([], now)
        yield sim_time
        lag = GaugeMetricFamily("parasweep_sim:live_lag_seconds",
                                "Wall seconds the live driver's last wakeup was late (CPU-bound server "
                                "when this stays well above ~0.002).")
        lag.add_metric([], self.lag())
        yield lag
