"""``/metrics`` as vLLM's Prometheus logger exports it (``vllm/v1/metrics/loggers.py``): the ``vllm:``
series parasweep reads, with vLLM's names, labels (``model_name``, ``engine``: the engine core's index)
and buckets. Latencies are in the engine's own (simulated) seconds. The simulated GPUs are served apart
(``GET /parasweep_sim/gpus``), as for SGLang."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from simulator.vllm.scheduler import VLLMReplica

LABELS = ["model_name", "engine"]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def length_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


class VLLMMetrics:
    """The registry ``GET /metrics`` serves; the reporter feeds the counters and histograms, the gauges
    are read from the engine cores when scraped."""

    def __init__(self, model: str, replicas: list[VLLMReplica], max_model_len: int) -> None:
        self.registry = reg = CollectorRegistry(auto_describe=False)
        self.model = model

        def hist(name: str, doc: str, buckets: list) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=reg)

        def counter(name: str, doc: str, extra: list[str] | None = None) -> Counter:
            return Counter(name, doc, LABELS + (extra or []), registry=reg)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_len = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", length_buckets(max_model_len)
        )
        self.gen_len = hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            length_buckets(max_model_len),
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        reg.register(_Gauges(model, replicas))
        if any(r.spec is not None for r in replicas):  # registered only with a speculative config, as vLLM
            reg.register(_SpecCounters(model, replicas))
        self.nixl: NixlMetrics | None = None

    def with_nixl(self) -> NixlMetrics:
        """The NIXL connector's series (registered with a ``--kv-transfer-config`` only, as vLLM's)."""
        self.nixl = NixlMetrics(self.registry, self.labels)
        return self.nixl

    def labels(self, engine: int) -> dict[str, str]:
        return {"model_name": self.model, "engine": str(engine)}


class _Gauges(Collector):
    """Running and waiting requests, the KV cache's use, preemptions and prefix-cache lookups, per engine
    core, as of the scrape."""

    def __init__(self, model: str, replicas: list[VLLMReplica]) -> None:
        self.model = model
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=LABELS
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=LABELS
        )
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=LABELS
        )
        preempted = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels=LABELS
        )
        queries = CounterMetricFamily(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels=LABELS,
        )
        hits = CounterMetricFamily(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels=LABELS
        )
        for engine, rep in enumerate(self.replicas):
            adm = rep.admission
            labels = [self.model, str(engine)]
            running.add_metric(labels, adm.num_running)
            waiting.add_metric(labels, len(adm.waiting))
            usage.add_metric(labels, adm.held_tokens / adm.kv_capacity)
            preempted.add_metric(labels, adm.preemptions)
            queries.add_metric(labels, adm.queried_total)
            hits.add_metric(labels, adm.cached_total)
        yield from (running, waiting, usage, preempted, queries, hits)


class _SpecCounters(Collector):
    """Speculative decoding's counters (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``), per
    engine core, since start: drafts (request-verifies), the tokens they proposed, those accepted, and the
    accepted ones by their position in the draft."""

    def __init__(self, model: str, replicas: list[VLLMReplica]) -> None:
        self.model = model
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        drafts = CounterMetricFamily("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                                     labels=LABELS)
        proposed = CounterMetricFamily("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                                       labels=LABELS)
        accepted = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                       labels=LABELS)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=[*LABELS, "position"])
        for engine, rep in enumerate(self.replicas):
            if rep.spec is None:
                continue
            st, k = rep.spec_stats, rep.spec.params.num_steps
            labels = [self.model, str(engine)]
            drafts.add_metric(labels, st.total_verifies)
            proposed.add_metric(labels, st.total_verifies * k)
            accepted.add_metric(labels, st.total_tokens - st.total_verifies)
            for pos in range(k):
                kept = st.accepted_at[pos] if pos < len(st.accepted_at) else 0
                per_pos.add_metric([*labels, str(pos)], kept)
        yield from (drafts, proposed, accepted, per_pos)


# NixlPromMetrics (nixl_connector.py, 0.11.2 to 0.19.0; nixl/stats.py in 0.34): each read's duration and
# bytes (per GPU: each worker reports its own), as the worker that reads observes them
NIXL_XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]


class NixlMetrics:
    """The KV reads a server made (decode side) and the held KV nobody read in time (prefill side)."""

    def __init__(self, reg: CollectorRegistry, labels: Callable[[int], dict[str, str]]) -> None:
        self.labels = labels
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds",
                                   "Histogram of transfer duration for NIXL KV Cache transfers.", LABELS,
                                   buckets=NIXL_XFER_BUCKETS, registry=reg)
        self.bytes = Histogram("vllm:nixl_bytes_transferred",
                               "Histogram of bytes transferred per NIXL KV Cache transfers.", LABELS,
                               buckets=NIXL_BYTES_BUCKETS, registry=reg)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.",
                              LABELS, registry=reg)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs",
                               "Number of requests that had their KV expire. NOTE: This metric is tracked "
                               "on the P instance.", LABELS, registry=reg)
