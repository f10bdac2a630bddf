"""The disaggregated SGLang runs of aiconfigurator-core's ``systems/silicon_sample.csv``: prefill and decode
servers on separate GPUs, measured as the aggregated rows are (:mod:`orchestrator.fidelity.silicon`), turned
into entries the replay runs the way they were deployed.

A disaggregated row gives each role's layout in AIConfigurator's terms (``<role>_tp_size``,
``<role>_attention_dp_size``, ``<role>_moe_ep_size``), its server count (``<role>_num_workers``) and the
decode batch of one attention-DP rank (``decode_batch_size``). Only rows that carry the worker counts are
read: the others name neither the servers nor the batch, and AIConfigurator cannot estimate them either.
In SGLang's terms a server has ``tp_size x attention_dp_size`` GPUs (AIConfigurator's "tp 1, attention_dp
8" is SGLang's ``--tp 8 --dp 8 --enable-dp-attention``), and the client's stream count is the decode batch
times the decode servers times their ranks.

The launch flags come from the srt-slurm recipe each InferenceX configuration ran (:data:`RECIPES`, keyed by
the ``config_id`` the row's source names, matched on the recipe's layout, server counts and concurrency
list). AIConfigurator's own runs (the gap analysis) publish no launch: SGLang's defaults. docs/fidelity.md,
"Disaggregated served runs", restates the sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.fidelity.corpus import Entry
from orchestrator.fidelity.silicon import (
    GPU_NAMES,
    NO_PROFILE,
    PREDICTED_SOURCE,
    SYSTEMS,
    SiliconRow,
    Unreplayable,
    client_workload,
    int_cell,
    model_for,
    read_csv,
    short_model,
    text_cell,
)
from vocab.hardware import load_hardware, place_servers
from vocab.model import ENGINE_NAMES

SRT_SLURM = "https://github.com/NVIDIA/srt-slurm/blob"
# what every DeepSeek recipe of srt-slurm sets on both roles: the prompts share no prefix; KV over NIXL
BOTH = {"disable_radix_cache": True}
TRANSFER = "nixl"
H200_RECIPE = f"{SRT_SLURM}/b2c9f1a4e56bbf948ebbbbb4463ba7735e97b4ea/recipes/h200/8k1k/bs128-1p1d-dep.yaml"
# B200: the per-variant files as they stood before they were merged into one file per length pair
B200_AT = f"{SRT_SLURM}/e5874f87"
B200_FP8_MERGED = f"{SRT_SLURM}/603fb034/recipes/b200-fp8/8k1k.yaml"
_B200_FP8_TP8 = {"mem_fraction_static": 0.85, "max_prefill_tokens": 32768, "chunked_prefill_size": 32768,
                 "max_running_requests": 512, "kv_cache_dtype": "fp8_e4m3", "stream_interval": 30}
_B200_FP8_DEP8 = {**_B200_FP8_TP8, "max_running_requests": 1024}
_B200_FP4 = {"mem_fraction_static": 0.85, "max_prefill_tokens": 32768, "chunked_prefill_size": 32768,
             "max_running_requests": 512, "kv_cache_dtype": "fp8_e4m3", "stream_interval": 30}
_B200_FP8_MERGED_PREFILL = {"mem_fraction_static": 0.6, "max_prefill_tokens": 8192,
                            "chunked_prefill_size": 65536, "max_running_requests": 8,
                            "kv_cache_dtype": "fp8_e4m3", "stream_interval": 30}
_B200_FP8_MERGED_DECODE = {"mem_fraction_static": 0.75, "kv_cache_dtype": "fp8_e4m3", "stream_interval": 30}


@dataclass(frozen=True)
class Recipe:
    """One InferenceX configuration's launch: where it is published and each role's flags (SGLang's
    names with underscores; the layout and server counts come from the row)."""

    url: str
    prefill: dict[str, object]
    decode: dict[str, object]


# config_id -> the srt-slurm recipe that configuration ran (the prefill server's "disable-cuda-graph" is
# left out: the simulated engine runs no graph for a prefill server's extends either way)
RECIPES: dict[int, Recipe] = {
    434: Recipe(H200_RECIPE,
                {"mem_fraction_static": 0.75, "max_running_requests": 16, "chunked_prefill_size": 163840,
                 "max_prefill_tokens": 163840},
                {"mem_fraction_static": 0.88, "max_running_requests": 256, "cuda_graph_max_bs": 256,
                 "stream_interval": 10}),
    453: Recipe(f"{B200_AT}/recipes/b200-fp8/8k1k/stp/low-latency-tep8-1p4d.yaml",
                _B200_FP8_TP8, {**_B200_FP8_TP8, "cuda_graph_max_bs": 512}),
    455: Recipe(f"{B200_AT}/recipes/b200-fp8/8k1k/stp/low-latency-tep8-1p1d.yaml (and 1k1k/stp/ for 1k/1k)",
                _B200_FP8_TP8, {**_B200_FP8_TP8, "cuda_graph_max_bs": 512}),
    457: Recipe(f"{B200_AT}/recipes/b200-fp8/8k1k/stp/max-tpt-dep8-1p1d.yaml",
                _B200_FP8_DEP8, {**_B200_FP8_DEP8, "cuda_graph_max_bs": 1024}),
    459: Recipe(f"{B200_AT}/recipes/b200-fp8/8k1k/stp/max-tpt-dep8-2p1d.yaml",
                _B200_FP8_DEP8, {**_B200_FP8_DEP8, "cuda_graph_max_bs": 1024}),
    527: Recipe(f"{B200_AT}/recipes/b200-fp4/1k1k/stp/max-tpt-dep4-1p-dep8-1d.yaml",
                {**_B200_FP4, "max_running_requests": 1024},
                {**_B200_FP4, "max_running_requests": 1024, "cuda_graph_max_bs": 1024}),
    530: Recipe(f"{B200_AT}/recipes/b200-fp4/8k1k/stp/low-latency-dep4-1p-tep8-1d.yaml",
                _B200_FP4, {**_B200_FP4, "cuda_graph_max_bs": 512}),
    532: Recipe(f"{B200_AT}/recipes/b200-fp4/1k1k/stp/max-tpt-dep4-1p-dep8-2d.yaml",
                _B200_FP4, {**_B200_FP4, "cuda_graph_max_bs": 512}),
    535: Recipe(f"{B200_AT}/recipes/b200-fp4/8k1k/stp/low-latency-tp4-1p-tp8-1d.yaml",
                _B200_FP4, {**_B200_FP4, "cuda_graph_max_bs": 512}),
    538: Recipe(f"{B200_AT}/recipes/b200-fp4/8k1k/stp/max-tpt-dep4-7p-dep8-2d.yaml",
                {**_B200_FP4, "max_running_requests": 1024, "max_prefill_tokens": 65536,
                 "chunked_prefill_size": 65536},
                {**_B200_FP4, "max_running_requests": 2048, "cuda_graph_max_bs": 1024}),
    639: Recipe(f"{B200_FP8_MERGED} (stp low-latency tp8-1p-4d)", _B200_FP8_MERGED_PREFILL,
                {**_B200_FP8_MERGED_DECODE, "max_running_requests": 32, "cuda_graph_max_bs": 32}),
    641: Recipe(f"{B200_FP8_MERGED} (stp max-tpt dep8-1p-1d)", _B200_FP8_MERGED_PREFILL,
                {**_B200_FP8_MERGED_DECODE, "max_running_requests": 256, "cuda_graph_max_bs": 256}),
    649: Recipe(f"{B200_FP8_MERGED} (stp max-tpt dep8-1p-2d)", _B200_FP8_MERGED_PREFILL,
                {**_B200_FP8_MERGED_DECODE, "max_running_requests": 128, "cuda_graph_max_bs": 128}),
    654: Recipe(f"{B200_FP8_MERGED} (stp max-tpt dep8-2p-1d)", _B200_FP8_MERGED_PREFILL,
                {**_B200_FP8_MERGED_DECODE, "max_running_requests": 512, "cuda_graph_max_bs": 512}),
    655: Recipe(f"{B200_FP8_MERGED} (stp max-tpt dep8-3p-1d)", _B200_FP8_MERGED_PREFILL,
                {**_B200_FP8_MERGED_DECODE, "max_running_requests": 1024, "cuda_graph_max_bs": 1024}),
}
# the configurations whose recipe runs the dense MLPs data-parallel on each attention-DP rank
# (--moe-dense-tp-size 1), which the simulated engine does not model: said on each of their rows
DENSE_TP1 = ("the recipe runs the dense MLPs data-parallel on each attention-DP rank "
             "(--moe-dense-tp-size 1): not modelled, replayed split over the server's GPUs")
DENSE_TP1_CONFIGS = {457, 459, 527, 530, 532, 535, 538, 639, 641, 649, 654, 655}


@dataclass(frozen=True)
class RoleShape:
    """One role of a disaggregated row in SGLang's terms: its servers, each of ``gpus`` GPUs with
    ``attention`` attention-DP ranks and experts over ``ep``."""

    workers: int
    gpus: int
    attention: int
    ep: int

    def label(self) -> str:
        shape = f"DP{self.attention}" if self.attention > 1 else f"TP{self.gpus}"
        if self.attention > 1 and self.attention != self.gpus:
            shape += f"xTP{self.gpus // self.attention}"
        return shape + (f" EP{self.ep}" if self.ep > 1 else "") + f" x{self.workers}"


@dataclass(kw_only=True)
class DisaggRow(SiliconRow):
    """One distinct disaggregated measurement, each role as it was deployed. ``tp`` and ``ep`` (the
    aggregated rows' layout) hold the decode server's."""

    prefill: RoleShape
    decode: RoleShape
    config_id: int | None = None

    @property
    def family(self) -> str:
        return (f"{short_model(self.model)} P {self.prefill.label()} / D {self.decode.label()} "
                f"{self.precision} on {self.system}")

    @property
    def gpus(self) -> int:
        return self.prefill.workers * self.prefill.gpus + self.decode.workers * self.decode.gpus


@dataclass
class DisaggCleaning:
    """What the reader did to the file's disaggregated rows of one engine, counted."""

    rows: int = 0
    without_topology: int = 0  # no worker counts: neither the servers nor the batch are known
    duplicates: int = 0
    distinct: int = 0
    notes: list[str] = field(default_factory=list)
    backend: str = "sglang"

    def lines(self) -> list[str]:
        engine = ENGINE_NAMES[self.backend]
        return [f"{self.rows} disaggregated {engine} rows: {self.without_topology} without worker counts "
                "(their servers and batch are not given; AIConfigurator cannot estimate them either)",
                f"{self.duplicates} rows repeating another export of the same measurement folded into it",
                f"{self.distinct} distinct disaggregated measurements with their topology"]


def read_disagg(path: str | Path, backend: str = "sglang") -> tuple[list[DisaggRow], DisaggCleaning]:
    """The distinct disaggregated measurements of ``backend`` (sglang or vllm) in the CSV at ``path`` that
    carry their topology."""
    needed = {f"{role}_{k}" for role in ("prefill", "decode")
              for k in ("num_workers", "tp_size", "attention_dp_size", "moe_ep_size", "batch_size")}
    df = read_csv(Path(path), needed | {"id", "silicon_data_source", "backend", "mode", "model_path",
                                        "system", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms"})
    clean = DisaggCleaning(backend=backend)
    df = df[(df["backend"] == backend) & (df["mode"] == "disagg")]
    clean.rows = len(df)
    kept: dict[tuple, DisaggRow] = {}
    for rec in df.to_dict("records"):
        row = _row(rec, backend)
        if row is None:
            clean.without_topology += 1
            continue
        key = (row.system, short_model(row.model), row.precision, row.isl, row.osl, row.concurrency,
               round(row.ttft_ms, 3), round(row.tpot_ms, 3))
        if key in kept:
            clean.duplicates += 1
            kept[key].duplicates.append(row.id)
            continue
        kept[key] = row
    rows = list(kept.values())
    clean.distinct = len(rows)
    return rows, clean


def _role(rec: dict, role: str) -> RoleShape | None:
    workers, tp, adp, ep = (int_cell(rec.get(f"{role}_{k}"))
                            for k in ("num_workers", "tp_size", "attention_dp_size", "moe_ep_size"))
    if not workers or not tp:
        return None
    adp = adp or 1
    return RoleShape(workers=workers, gpus=tp * adp, attention=adp, ep=ep or 1)


def _row(rec: dict, backend: str) -> DisaggRow | None:
    prefill, decode = _role(rec, "prefill"), _role(rec, "decode")
    batch = int_cell(rec.get("decode_batch_size"))
    if prefill is None or decode is None or not batch:
        return None
    source = text_cell(rec.get("silicon_data_source"))
    gap = "gap-analysis" in source or "aic-auto-gap" in source
    m = re.search(r"config_id=(\d+)", source)
    columns = {f"{role}_{k}": rec.get(f"{role}_{k}") for role in ("prefill", "decode")
               for k in ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size",
                         "moe_tp_size", "moe_ep_size")}
    columns |= {k: rec.get(k) for k in ("gemm_quant_mode", "moe_quant_mode")}
    return DisaggRow(
        id=str(rec["id"]), source=source, cohort="gap-analysis" if gap else "inferencex",
        version=text_cell(rec.get("backend_version")), model=str(rec["model_path"]),
        system=str(rec["system"]),
        precision=text_cell(rec.get("precision")) or "bf16", isl=int(rec["isl"]), osl=int(rec["osl"]),
        # the decode batch is one rank's: the client's streams fill every rank of every decode server
        concurrency=batch * decode.workers * decode.attention, tp=decode.gpus, ep=decode.ep, columns=columns,
        ttft_ms=float(rec["silicon_ttft_ms"]), tpot_ms=float(rec["silicon_tpot_ms"]),
        prefill=prefill, decode=decode, config_id=int(m.group(1)) if m else None, backend=backend)


def launch(row: DisaggRow) -> tuple[dict[str, object], dict[str, object], list[str]]:
    """(prefill flags, decode flags, what is assumed) for ``row``: its configuration's recipe, or SGLang's
    defaults where the launch is not published."""
    if row.cohort == "gap-analysis":
        return dict(BOTH), dict(BOTH), [
            "launch not published (AIConfigurator's gap analysis): SGLang's defaults for each role's layout, "
            f"radix cache off, KV over {TRANSFER.upper()}"]
    recipe = RECIPES.get(row.config_id or -1)
    if recipe is None:
        raise Unreplayable(f"InferenceX configuration {row.config_id}: no srt-slurm recipe is mapped to it")
    notes = [f"launch: srt-slurm recipe {recipe.url}"]
    if row.config_id in DENSE_TP1_CONFIGS:
        notes.append(DENSE_TP1)
    return {**BOTH, **recipe.prefill}, {**BOTH, **recipe.decode}, notes


def placed(row: DisaggRow) -> tuple[int, str]:
    """(the nodes ``row``'s servers take on its GPU's profile, placed in order, prefill servers first; how
    its client's streams follow from its decode batch). :class:`Unreplayable` where a server is wider than a
    node."""
    per_node = load_hardware(SYSTEMS[row.system]).num_gpus
    servers = [row.prefill.gpus] * row.prefill.workers + [row.decode.gpus] * row.decode.workers
    if max(servers) > per_node:
        raise Unreplayable(f"a server of {max(servers)} GPUs is wider than a node of {per_node}")
    ranks = row.decode.workers * row.decode.attention
    return place_servers(servers, per_node)[-1] + 1, (
        f"{row.concurrency} streams = decode batch {row.concurrency // ranks} x {row.decode.workers} decode "
        f"server(s) x {row.decode.attention} rank(s)")


def to_entry(row: DisaggRow) -> tuple[Entry, list[str]]:
    """``row`` as a replayable entry (the corpus format with its ``disaggregation`` block) and what its
    mapping assumes; raises :class:`Unreplayable`."""
    folder, quant, model_note = model_for(row)
    if row.system not in SYSTEMS:
        raise Unreplayable(f"GPU system {row.system}: {NO_PROFILE}")
    prefill_args, decode_args, notes = launch(row)
    both: dict[str, object] = {"quantization": quant} if quant else {}
    nodes, streams = placed(row)
    notes = [n for n in (model_note, *notes) if n]
    notes.append(streams)
    workload, client_notes = client_workload(row)
    notes += client_notes
    entry = Entry.model_validate({
        "id": row.id, "source_url": f"{PREDICTED_SOURCE}: {row.source}", "model": row.model,
        "gpu": GPU_NAMES[row.system], "gpu_count": row.gpus, "nodes": nodes,
        "sglang_version": row.version or "0.5.8.post1", "server_args": both,
        "disaggregation": {
            "transfer_backend": TRANSFER,
            "prefill": {"workers": row.prefill.workers, "tp": row.prefill.gpus, "ep": row.prefill.ep,
                        "attention": row.prefill.attention, "server_args": prefill_args},
            "decode": {"workers": row.decode.workers, "tp": row.decode.gpus, "ep": row.decode.ep,
                       "attention": row.decode.attention, "server_args": decode_args}},
        "workload": workload,
        "measured": {"mean_ttft_ms": row.ttft_ms, "mean_tpot_ms": row.tpot_ms},
        "parasweep": {"model": folder, "hardware": SYSTEMS[row.system]}})
    return entry, notes

