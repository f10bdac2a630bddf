"""SGLang-format log lines on stdout: ``[%Y-%m-%d %H:%M:%S PPk TPt] message`` (line format, rank tags,
startup and batch lines: docs/simulator.md, "Logs"). With ``SGLANG_LOG_MS=1`` the stamp carries
milliseconds, ``[%Y-%m-%d %H:%M:%S.mmm PPk TPt]``, as SGLang's does, so batch lines can be joined with
GPU samples to the millisecond.

Every line is flushed at once: the orchestrator tails the log file while the server runs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from simulator.cuda_graphs import capture_sizes
from simulator.entities import PDQueues
from simulator.sim_config import GIB, SimConfig

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class LogWriter:
    def __init__(self, level: str = "info", stream: TextIO | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.level = _LEVELS.get(level, 20)
        self.stream = stream or sys.stdout
        self.wall = wall
        self._last_sec = -1
        self._last_stamp = ""
        # SGLang reads it once, when it configures its loggers; it accepts "1" and "true"
        self.ms = os.environ.get("SGLANG_LOG_MS", "").strip().lower() in ("1", "true")

    def _stamp(self) -> str:
        t = self.wall()
        sec = int(t)
        if sec != self._last_sec:  # strftime is the expensive part; one per second is enough
            self._last_sec = sec
            self._last_stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        if self.ms:  # logging's %(msecs)03d: the fraction of the second, truncated
            return f"{self._last_stamp}.{int((t - sec) * 1000):03d}"
        return self._last_stamp

    def log(self, msg: str, tag: str = "", level: str = "info") -> None:
        if _LEVELS[level] < self.level:
            return
        self.stream.write(f"[{self._stamp()}{tag}] {msg}\n")
        self.stream.flush()

    def info(self, msg: str, tag: str = "") -> None:
        self.log(msg, tag, "info")

    def warning(self, msg: str, tag: str = "") -> None:
        self.log(msg, tag, "warning")

    def lines(self, msgs: list[tuple[str, str]], level: str = "info") -> None:
        """Several (tag, message) lines in one write, e.g. one per PP stage."""
        if _LEVELS[level] < self.level:
            return
        stamp = self._stamp()
        self.stream.write("".join(f"[{stamp}{tag}] {msg}\n" for tag, msg in msgs))
        self.stream.flush()


def rank_tag(cfg: SimConfig, pp_rank: int, tp_rank: int = 0, dp_rank: int = 0) -> str:
    """SGLang 0.5.23 order: DP, PP, TP, EP; each only when that dimension is > 1."""
    tag = ""
    if cfg.schedulers > 1:
        tag += f" DP{dp_rank}"
    if cfg.pp > 1:
        tag += f" PP{pp_rank}"
    if cfg.tp > 1:
        tag += f" TP{tp_rank}"
    if cfg.ep > 1:
        tag += f" EP{tp_rank // (cfg.tp // cfg.ep)}"
    return tag


def scheduler_tag(cfg: SimConfig, pp_rank: int, dp_rank: int) -> str:
    """The prefix of a scheduler's own lines: its first TP rank logs them (an attention-DP rank's first
    GPU in the TP group's numbering)."""
    return rank_tag(cfg, pp_rank, dp_rank * cfg.rank_tp if cfg.attn_dp > 1 else 0, dp_rank)


def decode_line(batch_size: int, used: int, usage: float, cuda_graph: bool, gen_tput: float,
                queue: int, spec: tuple[float, float] | None = None, pd: tuple[float, PDQueues] | None = None
                ) -> str:
    """SGLang 0.5.23's decode batch line; with speculative decoding, the interval's accept length and
    accept rate after the token usage; on a decode server (``pd``: the pre-allocated share of the pool and
    the queues), its pre-allocation and transfer queues after those."""
    accept = f"accept len: {spec[0]:.2f}, accept rate: {spec[1]:.2f}, " if spec is not None else ""
    role = ""
    if pd is not None:
        share, q = pd
        role = (f"pre-allocated usage: {share:.2f}, #prealloc-req: {q.prealloc}, "
                f"#transfer-req: {q.transfer}, #retracted-req: 0, ")
    return (
        f"Decode batch, #running-req: {batch_size}, #token: {used}, token usage: {usage:.2f}, {accept}{role}"
        f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_tput:.2f}, #queue-req: {queue}"
    )


def prefill_line(new_seq: int, new_tok: int, cached_tok: int, usage: float, running: int, queue: int,
                 pending: int, input_tput: float, pd: PDQueues | None = None) -> str:
    """SGLang 0.5.23's prefill batch line; on a prefill server (``pd``), its bootstrap and inflight
    queues before the graph flag (no optimistic prefill: ``--optimistic-prefill-attempts`` is 0)."""
    role = (f"#bootstrap-req: {pd.bootstrap}, #inflight-req: {pd.inflight}, #optimistic-req: 0, "
            if pd is not None else "")
    return (
        f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_tok}, #cached-token: {cached_tok}, "
        f"token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queue}, "
        f"#pending-token: {pending}, {role}cuda graph: False, input throughput (token/s): {input_tput:.2f}"
    )


def _server_args_repr(cfg: SimConfig) -> str:
    info = cfg.server_info()
    keys = [
        "model_path", "tokenizer_path", "served_model_name", "load_format", "context_length", "tp_size",
        "pp_size", "ep_size", "dp_size", "pp_async_batch_depth", "pp_max_micro_batch_size",
        "max_running_requests", "max_total_tokens", "chunked_prefill_size", "max_prefill_tokens",
        "mem_fraction_static", "disable_cuda_graph", "cuda_graph_max_bs_decode", "attention_backend",
        "disable_overlap_schedule", "moe_a2a_backend", "host", "port", "enable_metrics",
        "decode_log_interval", "random_seed", "log_level",
    ]
    body = ", ".join(f"{k}={info[k]!r}" for k in keys)
    return f"server_args=ServerArgs({body})"


def startup_lines(cfg: SimConfig, log: LogWriter) -> None:
    """The lines SGLang prints between launch and readiness, with simulated numbers."""
    spec = cfg.spec
    log.info(_server_args_repr(cfg))
    if cfg.args.attention_backend is None:
        log.info(f"Attention backend not specified. Use {cfg.attention_backend} backend by default.")
    for w in cfg.warnings:
        log.warning(w)
    total_gb = cfg.hw.memory_gb * 1e9 / GIB
    quant = f"quant={spec.quant_desc.split(' ')[0]}, " if spec.quant_desc else ""
    graph_sizes = list(capture_sizes(cfg.cuda_graph_max_bs_decode))
    for dp_rank in range(cfg.schedulers):
        for pp_rank, st in enumerate(cfg.stages):
            # an attention-DP rank's GPUs are its share of the one TP group, numbered across it
            first = dp_rank * cfg.rank_tp if cfg.attn_dp > 1 else 0
            for tp_rank in range(first, first + cfg.rank_tp):
                tag = rank_tag(cfg, pp_rank, tp_rank, dp_rank)
                w_gb = st.weight_bytes / GIB
                # Simulated load time: reading this GPU's shard from page cache at ~5 GB/s.
                load_s = st.weight_bytes / 5e9
                log.info(f"Load weight begin. avail mem={total_gb:.2f} GB", tag)
                log.info(
                    f"Load weight end. elapsed={load_s:.2f} s, type={spec.architecture}, {quant}"
                    f"avail mem={total_gb - w_gb:.2f} GB, mem usage={w_gb:.2f} GB.", tag
                )
                kv_gb = st.kv_bytes / GIB
                if spec.attention == "mla":
                    kv_desc = f"KV size: {kv_gb:.2f} GB"
                else:
                    kv_desc = f"K size: {kv_gb / 2:.2f} GB, V size: {kv_gb / 2:.2f} GB"
                log.info(
                    f"KV Cache is allocated. dtype: {_kv_torch_dtype(cfg.args.kv_cache_dtype)}, "
                    f"#tokens: {cfg.max_total_num_tokens}, "
                    f"{kv_desc}", tag
                )
                avail = (st.available_bytes + st.graph_bytes) / GIB
                log.info(f"Memory pool end. avail mem={avail:.2f} GB", tag)
                if not cfg.disable_cuda_graph:
                    log.info(
                        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                        f"avail mem={avail:.2f} GB", tag
                    )
                    log.info(
                        f"Capture target decode CUDA graph end. bs={graph_sizes}, elapsed=0.00 s, "
                        f"mem usage={st.graph_bytes / GIB:.2f} GB, "
                        f"avail mem={st.available_bytes / GIB:.2f} GB.",
                        tag,
                    )
            log.info(
                f"max_total_num_tokens={cfg.max_total_num_tokens}, "
                f"chunked_prefill_size={cfg.chunked_prefill_size}, "
                f"max_prefill_tokens={cfg.max_prefill_tokens}, "
                f"max_running_requests={cfg.max_running_requests}, context_len={cfg.context_len}, "
                f"available_gpu_mem={st.available_bytes / GIB:.2f} GB",
                scheduler_tag(cfg, pp_rank, dp_rank),
            )


def _kv_torch_dtype(flag: str) -> str:
    """The torch dtype SGLang names for a --kv-cache-dtype value ("auto": the model's, BF16 here)."""
    return {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2",
            "mxfp8": "torch.float8_e4m3fn"}.get(flag, "torch.bfloat16")
