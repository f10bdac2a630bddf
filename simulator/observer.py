"""Fans the engine's reports out to log lines and Prometheus metrics, the way SGLang's scheduler
(batch stats, one line per PP stage) and tokenizer manager (latency histograms) do."""

from __future__ import annotations

from simulator.engine import Engine, Request
from simulator.logs import LogWriter, decode_line, prefill_line, rank_tag
from simulator.metrics import Metrics, StageGauges
from simulator.resolve import SimConfig


class Reporter:
    def __init__(self, cfg: SimConfig, log: LogWriter, metrics: Metrics | None, dp_rank: int) -> None:
        self.cfg = cfg
        self.log = log
        self.metrics = metrics
        self.gauges = metrics.gauges[dp_rank] if metrics is not None else StageGauges()
        # Only tp_rank 0 of each stage prints batch statistics.
        self.tags = [rank_tag(cfg, pp, 0, dp_rank) for pp in range(cfg.pp)]

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

    # scheduler side
    def _set(self, eng: Engine, running: int) -> float:
        g = self.gauges
        usage = eng.kv_used / eng.kv_capacity
        g.num_running = running
        g.num_queue = len(eng.waiting)
        g.num_used = eng.kv_used
        g.token_usage = usage
        return usage

    def on_prefill_batch(self, eng: Engine, n_new: int, n_tokens: int, running: int) -> None:
        usage = self._set(eng, running)
        tput = eng.input_throughput_and_reset()
        msg = prefill_line(n_new, n_tokens, usage, running, len(eng.waiting), eng.pending_tokens, tput)
        self.log.lines([(tag, msg) for tag in self.tags])

    def on_decode_log(self, eng: Engine, batch_size: int, cuda_graph: bool) -> None:
        usage = self._set(eng, batch_size)
        self.gauges.gen_throughput = eng.last_gen_throughput
        self.gauges.cuda_graph = cuda_graph
        msg = decode_line(batch_size, eng.kv_used, usage, cuda_graph, eng.last_gen_throughput,
                          len(eng.waiting))
        self.log.lines([(tag, msg) for tag in self.tags])

    def on_idle(self, eng: Engine) -> None:
        self._set(eng, 0)
