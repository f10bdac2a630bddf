"""The engine core's reports in vLLM's words: the per-request series of ``/metrics`` as vLLM's output
processor records them, and the stats line its logging stat logger prints every
``VLLM_LOG_STATS_INTERVAL`` seconds (10; ``vllm/v1/metrics/loggers.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.entities import Request
from simulator.logs import LogWriter
from simulator.vllm.metrics import VLLMMetrics
from simulator.vllm.releases import played
from simulator.vllm.scheduler import VLLMReplica

STATS_INTERVAL_S = 10.0  # VLLM_LOG_STATS_INTERVAL's default, in the engine's seconds
STATS_WHERE = "loggers.py:259"  # where 0.19's LoggingStatLogger.log prints the line
SPEC_WHERE = "metrics.py:101"  # where 0.19's SpecDecodingLogging.log prints the speculative line


class VLLMReporter:
    """The ``replica.Observer`` of one engine core in the live server (scheduler-side reports are read
    from the core itself when scraped or logged, as vLLM's scheduler stats are)."""

    def __init__(self, metrics: VLLMMetrics, engine: int) -> None:
        self.metrics = metrics
        self.labels = metrics.labels(engine)
        self.generated = 0  # output tokens since start (the stats line's generation throughput)

    def on_first_token(self, req: Request, now: float) -> None:
        m = self.metrics
        m.ttft.labels(**self.labels).observe(now - req.arrival)
        m.queue_time.labels(**self.labels).observe(max(req.forward_entry - req.arrival, 0.0))
        m.prompt_tokens.labels(**self.labels).inc(req.input_len)
        m.generation_tokens.labels(**self.labels).inc()
        self.generated += 1

    def on_token(self, req: Request, itl: float) -> None:
        self.metrics.itl.labels(**self.labels).observe(itl)
        self.metrics.generation_tokens.labels(**self.labels).inc()
        self.generated += 1

    def on_finish(self, req: Request, now: float) -> None:
        m = self.metrics
        m.e2e.labels(**self.labels).observe(now - req.arrival)
        if req.forward_entry >= 0 and req.first_token_time >= 0:  # first scheduled to first token, as vLLM
            m.prefill_time.labels(**self.labels).observe(req.first_token_time - req.forward_entry)
        m.prompt_len.labels(**self.labels).observe(req.input_len)
        m.gen_len.labels(**self.labels).observe(len(req.output_ids))
        m.success.labels(**self.labels, finished_reason="length").inc()

    def on_step(self, tokens: int) -> None:
        self.metrics.iteration_tokens.labels(**self.labels).observe(tokens)

    # SGLang's scheduler-side reports have no vLLM counterpart: vLLM's are read from the core
    def on_prefill_batch(
        self, replica: object, n_new: int, n_tokens: int, n_cached: int, running: int
    ) -> None:
        """Not reported per batch by vLLM."""

    def on_decode_log(self, replica: object, batch_size: int, cuda_graph: bool) -> None:
        """Not reported per batch by vLLM."""

    def on_idle(self, replica: object) -> None:
        """vLLM's gauges are read when scraped."""

    def on_kv_transferred(self, seconds: float, nbytes: float) -> None:
        """No disaggregation in the vLLM dialect."""

    def on_pd_stage(self, stage: str, seconds: float) -> None:
        """No disaggregation in the vLLM dialect."""

    def on_dp_balance(self, imbalance_ratio: float | None, sync_wait: float) -> None:
        """No attention DP in the vLLM dialect."""


@dataclass
class _Since:
    time: float
    prompt: int
    generated: int
    preemptions: int
    drafts: int = 0
    accepted: int = 0
    accepted_at: tuple[int, ...] = ()


class StatsLine:
    """Engine ``engine``'s periodic line: throughputs over the interval, requests running and waiting,
    preemptions in the interval (only where there were any), KV cache use and the prefix cache's hit rate
    (since start: vLLM's is over its last 1,000 requests). An interval with no throughput, after one
    without, is logged at debug level, as vLLM keeps an idle server quiet. With speculative decoding the
    interval's drafts follow on a line of their own, at the same level (none where nothing was drafted)."""

    def __init__(
        self, replica: VLLMReplica, reporter: VLLMReporter, engine: int, release: str, log: LogWriter
    ) -> None:
        self.replica, self.reporter, self.engine, self.log = replica, reporter, engine, log
        self.release = played(release)
        self.last = _Since(0.0, 0, 0, 0)
        self.last_busy = False

    def tick(self, now: float) -> None:
        rep, adm = self.replica, self.replica.admission
        dt = now - self.last.time
        if dt <= 0:
            return
        prompt_tput = (rep.prompt_tokens_computed - self.last.prompt) / dt
        gen_tput = (self.reporter.generated - self.last.generated) / dt
        preempted = adm.preemptions - self.last.preemptions
        since = self.last
        st = rep.spec_stats
        self.last = _Since(now, rep.prompt_tokens_computed, self.reporter.generated, adm.preemptions,
                           st.total_verifies, st.total_tokens - st.total_verifies, tuple(st.accepted_at))
        busy = bool(prompt_tput or gen_tput)
        level = "info" if busy or self.last_busy else "debug"
        self.last_busy = busy
        parts = [
            f"Avg prompt throughput: {prompt_tput:.1f} tokens/s",
            f"Avg generation throughput: {gen_tput:.1f} tokens/s",
            f"Running: {adm.num_running} reqs",
            f"Waiting: {len(adm.waiting)} reqs",
        ]
        if preempted > 0:
            parts.append(f"Preemptions: {preempted}")
        parts.append(f"{self.release.kv_usage_label}: {100 * adm.held_tokens / adm.kv_capacity:.1f}%")
        if self.release.hit_rate_always or adm.queried_total:
            rate = adm.cached_total / adm.queried_total if adm.queried_total else 0.0
            parts.append(f"Prefix cache hit rate: {100 * rate:.1f}%")
        self.log.log(f"Engine {self.engine:03d}: " + ", ".join(parts), STATS_WHERE, level)
        if rep.spec is not None:
            self._spec_line(since, dt, level)

    def _spec_line(self, since: _Since, dt: float, level: str) -> None:
        """vLLM's ``SpecDecodingLogging.log``: the interval's mean acceptance length (1 + accepted per
        draft), throughputs, totals, the acceptance rate at each draft position and over all drafted
        tokens."""
        k = self.replica.spec.params.num_steps  # type: ignore[union-attr]
        drafts = self.last.drafts - since.drafts
        if drafts <= 0:
            return
        accepted = self.last.accepted - since.accepted
        proposed = drafts * k
        now_at, then_at = self.last.accepted_at, since.accepted_at
        rates = [((now_at[i] if i < len(now_at) else 0) - (then_at[i] if i < len(then_at) else 0)) / drafts
                 for i in range(k)]
        self.log.log(
            f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
            f"Accepted throughput: {accepted / dt:.2f} tokens/s, Drafted throughput: {proposed / dt:.2f} "
            f"tokens/s, Accepted: {accepted} tokens, Drafted: {proposed} tokens, Per-position acceptance "
            f"rate: {', '.join(f'{r:.3f}' for r in rates)}, Avg Draft acceptance rate: "
            f"{100 * accepted / proposed:.1f}%", SPEC_WHERE, level)
