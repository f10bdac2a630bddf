"""A workload's real traffic: the config keys that choose it, checked, and the :class:`Source` they make.

``workload.source`` picks where requests come from (``random``: generated ids; ``sharegpt``; the
``mooncake`` and ``azure`` traces); ``workload.arrival`` how open-loop requests arrive (Poisson, gamma
with a coefficient of variation, evenly, or on a trace's own timestamps). Everything a bad value can be
is one line naming the key (docs/workloads.md).
"""

from __future__ import annotations

import math
from pathlib import Path

from orchestrator.config.model_info import model_info
from orchestrator.config.schema import ParasweepConf, WorkloadConf
from orchestrator.errors import ConfigError
from vocab.assets import model_dir
from vocab.load import ARRIVALS, SOURCES, TRACE_SOURCES, RequestSpec, SharedPrefix, Source, parse_arrival


def validate_traffic(cfg: ParasweepConf) -> None:
    """The traffic keys of ``cfg.workload``, and the source's file read once (so a missing or malformed
    file fails the sweep before anything starts)."""
    w = cfg.workload
    if w.source not in SOURCES:
        raise ConfigError("workload.source", w.source, ", ".join(SOURCES))
    try:
        kind, _ = parse_arrival(w.arrival)
    except ValueError as exc:
        raise ConfigError("workload.arrival", w.arrival, ", ".join(ARRIVALS), why=str(exc)) from None
    traces = " or ".join(TRACE_SOURCES)
    if kind == "trace":
        if w.source not in TRACE_SOURCES:
            raise ConfigError("workload.arrival", w.arrival, "poisson, gamma:CV or constant",
                              why=f"a trace's own times need workload.source={traces}")
        if w.rate:
            raise ConfigError("workload.rate", list(w.rate), "[] (empty)",
                              why="with arrival=trace the open-loop points are workload.trace_speed")
        speeds = list(w.trace_speed)
        if not speeds or len(set(speeds)) != len(speeds) or not all(
                isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in speeds):
            raise ConfigError("workload.trace_speed", speeds,
                              "a list of distinct speed factors > 0 (1: as recorded, 2: twice as fast)")
    if w.multi_turn and w.source != "sharegpt":
        raise ConfigError("workload.multi_turn", True, "false",
                          why=f"multi-turn sessions come from ShareGPT (workload.source={w.source})")
    if not (math.isfinite(w.think_time_s) and w.think_time_s >= 0):
        raise ConfigError("workload.think_time_s", w.think_time_s, "seconds >= 0")
    if not (isinstance(w.block_size, int) and w.block_size >= 1):
        raise ConfigError("workload.block_size", w.block_size, "tokens per hash id, an integer >= 1")
    if not (math.isfinite(w.trace_start_s) and w.trace_start_s >= 0):
        raise ConfigError("workload.trace_start_s", w.trace_start_s, "seconds >= 0")
    if w.trace_window_s is not None and not (math.isfinite(w.trace_window_s) and w.trace_window_s > 0):
        raise ConfigError("workload.trace_window_s", w.trace_window_s, "seconds > 0, or null for the rest")
    if w.source == "random":
        return
    if w.source == "shared-prefix":
        if w.api == "chat":
            raise ConfigError("workload.api", w.api, "generate or completions",
                              why="generated shared prefixes are token ids, not text")
        shared_prefix_of(w)
        return
    if w.source in TRACE_SOURCES and w.api == "chat":
        raise ConfigError("workload.api", w.api, "generate or completions",
                          why=f"a {w.source} trace has token counts, not text")
    source = source_of(cfg)
    from workloads.sources import source_requests
    from workloads.sources.tokenize import tokenizer

    if source.kind == "sharegpt":
        try:
            tokenizer(source.tokenizer)
        except ValueError as exc:
            raise ConfigError("workload.tokenizer", w.tokenizer, "auto, quicktok:<encoding> or a "
                              "tokenizer.json path", why=str(exc).split(": ", 1)[-1]) from None
    try:
        source_requests(_spec_for_check(cfg, source))
    except ValueError as exc:
        raise ConfigError("workload.dataset_path", w.dataset_path or "null (the shipped copy)",
                          f"a readable {w.source} file", why=str(exc)) from None


def source_of(cfg: ParasweepConf) -> Source:
    """The :class:`Source` of ``cfg.workload`` (its source must not be ``random``)."""
    w = cfg.workload
    model = model_info(cfg.model.path)
    return Source(kind=w.source, path=_path(w), tokenizer=tokenizer_name(cfg), multi_turn=w.multi_turn,
                  think_s=w.think_time_s, context=model.max_context, start_s=w.trace_start_s,
                  window_s=w.trace_window_s, block_size=w.block_size, shared_prefix=shared_prefix_of(w))


def shared_prefix_of(w: WorkloadConf) -> SharedPrefix:
    """``workload.shared_prefix``, checked: a bad value is one line naming its key."""
    sp = w.shared_prefix
    values = {k: getattr(sp, k) for k in ("groups", "prompts_per_group", "system_len", "question_len",
                                          "output_len", "zipf")}
    try:
        return SharedPrefix(**values)
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]
        raise ConfigError(f"workload.shared_prefix.{name}", values.get(name),
                          "an exponent > 0, or null" if name == "zipf" else "an integer >= 1") from None


def tokenizer_name(cfg: ParasweepConf) -> str:
    """``workload.tokenizer``, with ``auto`` resolved for the model (its own, or a bundled one)."""
    from workloads.sources.tokenize import pick

    if cfg.workload.tokenizer != "auto":
        return cfg.workload.tokenizer
    model = model_info(cfg.model.path)
    return pick(model_dir(cfg.model.path), model.model_type, model.vocab_size)[0]


def traffic_note(cfg: ParasweepConf) -> str:
    """One line for the run: what the source read, what it sends, what it skipped, and (text) which
    tokenizer made the ids: the model's own, or which stand-in."""
    from workloads.sources import source_requests
    from workloads.sources.tokenize import pick

    note = source_requests(_spec_for_check(cfg, source_of(cfg))).summary()
    if cfg.workload.source != "sharegpt":
        return note
    if cfg.workload.tokenizer != "auto":
        return f"{note}; tokenizer {cfg.workload.tokenizer} (workload.tokenizer)"
    model = model_info(cfg.model.path)
    return f"{note}; tokenizer: {pick(model_dir(cfg.model.path), model.model_type, model.vocab_size)[1]}"


def _path(w: WorkloadConf) -> str | None:
    return str(Path(w.dataset_path).expanduser().resolve()) if w.dataset_path else None


def _spec_for_check(cfg: ParasweepConf, source: Source) -> RequestSpec:

    return RequestSpec(api=cfg.workload.api, seed=cfg.workload.seed,
                       vocab_size=model_info(cfg.model.path).vocab_size, source=source)
