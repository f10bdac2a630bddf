"""Fans the replica model's reports out to log lines and Prometheus metrics, the way SGLang's scheduler
(batch statistics, one line per PP stage) and tokenizer manager (latency histograms) do."""

from __future__ import annotations

from simulator.entities import Request
from simulator.logs import LogWriter, decode_line, prefill_line, scheduler_tag
from simulator.prometheus import PrometheusMetrics, StageGauges
from simulator.replica import ReplicaModel
from simulator.sim_config import SimConfig


class Reporter:
    """The ``replica.Observer`` of one DP replica in the live server."""

    def __init__(self, cfg: SimConfig, log: LogWriter, metrics: PrometheusMetrics | None,
                 dp_rank: int) -> None:
        self.log = log
        self.metrics = metrics
        self.dp_rank = dp_rank
        self.gauges = metrics.gauges[dp_rank] if metrics is not None else StageGauges()
        # Only tp_rank 0 of each stage prints batch statistics.
        self.tags = [scheduler_tag(cfg, pp, dp_rank) for pp in range(cfg.pp)]

    # tokenizer-manager side (simulated seconds)
    def on_first_token(self, req: Request, now: float) -> None:
        if self.metrics is not None:
            self.metrics.ttft[req.stream].observe(now - req.arrival)

    def on_token(self, req: Request, itl: float) -> None:
        if self.metrics is not None:
            self.metrics.itl.observe(itl)

    def on_finish(self, req: Request, now: float) -> None:
        m = self.metrics
        if m is not None:
            m.e2e[req.stream].observe(now - req.arrival)
            m.prompt_tokens[req.stream].inc(req.input_len)
            m.gen_tokens[req.stream].inc(len(req.output_ids))
            m.num_requests[req.stream].inc()
            if req.cached > 0:
                m.cached_tokens.inc(req.cached)

    # scheduler side
    def _set(self, replica: ReplicaModel, running: int) -> float:
        g = self.gauges
        adm = replica.admission
        held = adm.held_tokens  # SGLang's #token: the pool less free and evictable cached tokens
        usage = held / adm.kv_capacity
        g.num_running = running
        g.num_queue = len(adm.waiting)
        g.num_used = held
        g.token_usage = usage
        return usage

    def on_prefill_batch(self, replica: ReplicaModel, n_new: int, n_tokens: int, n_cached: int,
                         running: int) -> None:
        usage = self._set(replica, running)
        # the batch's share of its prompt tokens found in the cache, as SGLang sets it per prefill batch
        self.gauges.cache_hit_rate = n_cached / (n_tokens + n_cached) if n_tokens + n_cached else 0.0
        adm = replica.admission
        tput = replica.input_throughput_and_reset()
        pd = replica.pd_queues() if replica.pd_queues is not None else None
        msg = prefill_line(n_new, n_tokens, n_cached, usage, running, len(adm.waiting), adm.pending_tokens,
                           tput, pd)
        self.log.lines([(tag, msg) for tag in self.tags])

    def on_decode_log(self, replica: ReplicaModel, batch_size: int, cuda_graph: bool) -> None:
        usage = self._set(replica, batch_size)
        self.gauges.gen_throughput = replica.last_gen_throughput
        self.gauges.cuda_graph = cuda_graph
        accept = None
        if replica.spec is not None:  # SGLang's interval statistics, reset at each line
            length = replica.spec_stats.interval()
            accept = (length, replica.spec.accept_rate(length))
            self.gauges.spec_accept_length, self.gauges.spec_accept_rate = accept
        queue, pd = len(replica.admission.waiting), None
        if replica.pd_queues is not None:  # a decode server: #queue-req counts those whose KV arrived
            q = replica.pd_queues()
            queue, pd = len(replica.kv_arrived), (q.preallocated_tokens / replica.admission.kv_capacity, q)
        msg = decode_line(batch_size, replica.admission.held_tokens, usage, cuda_graph,
                          replica.last_gen_throughput, queue, accept, pd)
        self.log.lines([(tag, msg) for tag in self.tags])

    def on_kv_transferred(self, seconds: float, nbytes: float) -> None:
        """A prefill server's request has all its KV at its decode server: SGLang observes the latency
        (from the last chunk's forward), the speed and the size (in MiB, as it divides by 1024 x 1024)."""
        if self.metrics is not None:
            self.metrics.kv_transfer_latency_ms.observe(seconds * 1e3)
            self.metrics.kv_transfer_total_mb.observe(nbytes / 2**20)

    def on_dp_balance(self, imbalance_ratio: float | None, sync_wait: float) -> None:
        """One lockstep forward of the attention-DP ranks: the busiest rank's tokens over the mean (rank 0
        observes it) and this rank's wait for the slowest at the exchange of batch sizes."""
        if self.metrics is not None:
            if imbalance_ratio is not None:
                self.metrics.dp_imbalance_ratio.observe(imbalance_ratio)
            self.metrics.dp_sync_wait[self.dp_rank].observe(sync_wait)

    def on_pd_stage(self, stage: str, seconds: float) -> None:
        """A disaggregated request left one stage of its timeline (SGLang's ``per_stage_req_latency``;
        ``queue_time``: its wait in the waiting queue)."""
        if self.metrics is not None:
            if stage == "queue_time":
                self.metrics.queue_time.observe(seconds)
            else:
                self.metrics.stage_latency(stage).observe(seconds)

    def on_idle(self, replica: ReplicaModel) -> None:
        self._set(replica, 0)
