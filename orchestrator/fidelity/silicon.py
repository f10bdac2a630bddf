"""Measured SGLang serving runs that ship inside aiconfigurator-core (``systems/silicon_sample.csv``),
cleaned and turned into entries the replay runs the way they were measured.

The file holds one row per measured point: model, GPU system, precision, layout, the nominal input and
output lengths, the closed-loop concurrency and two numbers, the mean TTFT and the mean per-request TPOT.
Most rows are InferenceX runs (a public benchmark that reruns SGLang releases nightly); the rest are
AIConfigurator's own "gap analysis" runs, whose client is not public. docs/fidelity.md, "Recent served
runs", has the protocol and the launch flags per source, which this module restates as data.

Cleaning, each step counted and said (:class:`Cleaning`):

* only SGLang rows; disaggregated rows are counted apart (``silicon_disagg`` reads them);
* 20 GB200 "aggregated" rows at TP72 are multi-node disaggregated runs from an older export schema:
  dropped;
* legacy rows store TP x EP in ``tp_size`` (``tp16 / moe_tp4 / moe_ep4`` is ``--tp 4 --ep-size 4`` on four
  GPUs): the real layout is restored;
* the same measurement exported several times (identical lengths, concurrency, TTFT and TPOT; DeepSeek-R1
  and -V3 naming the same checkpoint) is kept once, the others listed as its duplicates.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TypeVar

import pandas as pd

from orchestrator.errors import UserError
from orchestrator.fidelity.corpus import Entry
from vocab.model import ENGINE_NAMES

# InferenceX's client: vLLM's older benchmarks/benchmark_serving.py, closed loop of C streams
INFERENCEX_TOOL = "benchmark_serving (InferenceX)"
INFERENCEX_REQUESTS_PER_STREAM = 10  # --num-prompts 10·C
INFERENCEX_RANGE_RATIO = 0.8  # --random-range-ratio: lengths uniform in [floor(0.8·L), L]
INFERENCEX_SEED = 0
WARMUP_FROM = "2026-01-21"  # InferenceX's client sends 2·C warm-up requests from this date on
# AIConfigurator's own runs: their client is not published; aiperf (the harness AIConfigurator publishes)
# sends fixed lengths. The request count is unknown too: 10·C as InferenceX's client sends, which gives the
# means as much burst and drain as those rows have
GAP_TOOL = "aiperf (AIConfigurator gap analysis, assumed)"
GAP_REQUESTS_PER_STREAM = 10
# Gap-analysis batches (the folder of the source file) whose own numbers rule out fixed lengths: with every
# request the same length a closed loop stays in waves (all C prompts arrive together, SGLang prefills them
# all before any decodes, they finish together, their successors arrive together), so the mean TTFT is at
# least half the time to prefill C prompts. The H200 batch reports Llama-3.1-8B at 128 streams of 4,000
# tokens with a mean TTFT of 0.8 s where one H200 needs about 4 s for half of 512k prompt tokens: its
# lengths varied (how is not published; benchmark_serving's one-sided spread is assumed). The H100 batch
# shows the waves' signature instead (TTFT growing in proportion to C x ISL) and keeps fixed lengths.
GAP_VARIED_BATCHES = ("data/h200_sxm/sglang/0.5.6.post2/",)
GAP_VARIED_TOOL = "benchmark_serving-like lengths (AIConfigurator gap analysis, client not published)"
PREDICTED_SOURCE = "aiconfigurator-core systems/silicon_sample.csv"

# (pattern on the CSV's model_path, why the simulated engine does not price it)
UNMODELLED = (
    (r"qwen3\.5", "Qwen3.5's linear-attention (Gated DeltaNet) layers are not modelled by the simulated "
                  "engine"),
    (r"glm-5", "GLM-5's sparse attention (DSA, SGLang's nsa backend) is not modelled by the simulated "
               "engine"),
)
# (pattern on model_path, precision, folder under models/, --quantization, what the mapping assumes)
MODELS = (
    (r"deepseek-(r1|v3)", "fp8", "deepseek-v3", None,
     "DeepSeek-R1 (0528) has DeepSeek-V3's architecture and FP8 block weights"),
    (r"deepseek-(r1|v3)", "fp4", "deepseek-r1-nvfp4", None,
     "NVIDIA's NVFP4 DeepSeek-R1 (0528): DeepSeek-V3's architecture, MLPs and experts in NVFP4"),
    (r"qwen3-235b-a22b-fp8", "fp8", "qwen3-235b-a22b-fp8", None, ""),
    (r"qwen3-32b$", "bf16", "qwen3-32b", None, ""),
    (r"qwen3-32b$", "fp8", "qwen3-32b", "fp8",
     "FP8 (block-scaled, AIConfigurator's fp8_block) priced as the BF16 checkpoint quantized to FP8 at load "
     "(--quantization fp8): the checkpoint is not recorded"),
    (r"llama-3\.1-8b", "fp8", "llama-3.1-8b", "fp8",
     "the BF16 checkpoint quantized to FP8 at load (--quantization fp8): the checkpoint is not recorded"),
)
SYSTEMS = {"h100_sxm": "h100-sxm-x8", "h200_sxm": "h200-nvlink-x8", "b200_sxm": "b200-sxm-x8",
           "b300_sxm": "b300-sxm-x8"}
GPU_NAMES = {"h100_sxm": "NVIDIA H100 80GB", "h200_sxm": "NVIDIA H200 141GB", "b200_sxm": "NVIDIA B200",
             "b300_sxm": "NVIDIA B300"}
NO_PROFILE = "no hardware profile maps to it"  # why a row on a GPU parasweep has no profile of is skipped
MISLABELLED_TP = 72  # GB200 NVL72 "aggregated" rows: really multi-node disaggregated


R = TypeVar("R", bound="SiliconRow")


class SiliconError(UserError):
    """A silicon CSV that cannot be read; the message names the file and what is wrong."""


@dataclass
class SiliconRow:
    """One distinct measured point, its layout as it ran."""

    id: str
    source: str  # the CSV's silicon_data_source: where the row was exported from
    cohort: str  # "inferencex" or "gap-analysis"
    version: str  # SGLang release as recorded ("" where the image was not recorded)
    model: str  # Hugging Face id as the CSV names it
    system: str  # aiconfigurator-core's system name
    precision: str  # fp8, fp4, bf16
    isl: int
    osl: int
    concurrency: int
    tp: int
    ep: int
    columns: dict[str, object]  # the CSV's layout columns as given (AIConfigurator reads these)
    ttft_ms: float
    tpot_ms: float
    fixes: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    apart: str = ""  # why the row is scored apart from the others ("" where it is not): apart_reason
    backend: str = "sglang"  # the engine that served it: sglang or vllm
    dp: int = 1  # data-parallel ranks (vLLM's --data-parallel-size with the experts spread over them)

    @property
    def group(self) -> str:
        """The model x GPU group a fitted term is held out by."""
        return f"{short_model(self.model)} on {self.system}"

    @property
    def family(self) -> str:
        """Model, GPU, layout and precision: the rows a trust band is computed over."""
        if self.dp > 1:  # vLLM's rows: one DP rank per GPU, the experts over all of them
            layout = f"DP{self.dp} EP{self.dp}"
        else:
            layout = f"TP{self.tp}" + (f" EP{self.ep}" if self.ep > 1 else "")
        return f"{short_model(self.model)} {layout} {self.precision} on {self.system}"


@dataclass
class Cleaning:
    """What the reader did to the file, counted."""

    backend_rows: int = 0
    disaggregated: int = 0
    mislabelled: list[str] = field(default_factory=list)
    relabelled: int = 0  # legacy TP x EP rows given their real layout
    duplicates: int = 0
    distinct: int = 0
    apart: int = 0  # rows replayed but scored apart (apart_reason)

    backend: str = "sglang"

    def lines(self) -> list[str]:
        engine = ENGINE_NAMES[self.backend]
        return [f"{self.backend_rows} {engine} rows: {self.disaggregated} disaggregated "
                "(replayed apart, below)",
                f"{len(self.mislabelled)} GB200 'aggregated' rows at TP{MISLABELLED_TP} dropped: multi-node "
                "disaggregated runs from an older export schema",
                f"{self.relabelled} rows storing TP x EP in tp_size given their real layout "
                "(--tp = --ep-size = moe_ep)",
                f"{self.duplicates} rows repeating another export of the same measurement folded into it",
                f"{self.distinct} distinct aggregated measurements, {self.apart} of them scored apart "
                "(measured without warm-up, or slower than on a GPU whose figures are no higher)"]


def default_csv() -> Path:
    """The file the installed aiconfigurator-core ships."""
    try:
        root = resources.files("aiconfigurator_core")
    except ModuleNotFoundError:
        raise SiliconError("--silicon: aiconfigurator-core is not installed; give the CSV's path") from None
    return Path(str(root)) / "systems" / "silicon_sample.csv"


def short_model(model: str) -> str:
    name = model.split("/")[-1]
    return "DeepSeek-R1" if re.match(r"deepseek-(r1|v3)", name.lower()) else name


def int_cell(v: object) -> int | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)  # type: ignore[arg-type]


def text_cell(v: object) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def read_csv(file: Path, needed: set[str]) -> pd.DataFrame:
    """The silicon CSV at ``file`` with at least the columns ``needed``; a one-line SiliconError where it
    cannot be read or lacks one."""
    try:
        df = pd.read_csv(file)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise SiliconError(f"--silicon {file}: cannot read it as CSV ({e})") from None
    missing = sorted(needed - set(df.columns))
    if missing:
        raise SiliconError(f"--silicon {file}: missing column(s) {', '.join(missing)}; valid: the format of "
                           "aiconfigurator-core's systems/silicon_sample.csv")
    return df


def read_silicon(path: str | Path, backend: str = "sglang") -> tuple[list[SiliconRow], Cleaning]:
    """The distinct aggregated measurements of ``backend`` (sglang or vllm) in the CSV at ``path``, cleaned
    (module doc)."""
    file = Path(path)
    df = read_csv(file, {"id", "silicon_data_source", "backend", "backend_version", "model_path", "system",
                         "precision", "mode", "isl", "osl", "batch_size", "tp_size", "moe_tp_size",
                         "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms"})
    clean = Cleaning(backend=backend)
    df = df[df["backend"] == backend]
    clean.backend_rows = len(df)
    clean.disaggregated = int((df["mode"] != "agg").sum())
    kept: dict[tuple, SiliconRow] = {}
    for rec in df[df["mode"] == "agg"].to_dict("records"):
        row = _row(rec, clean) if backend == "sglang" else _vllm_row(rec)
        if row is None:
            continue
        key = (row.system, short_model(row.model), row.precision, row.isl, row.osl, row.concurrency,
               round(row.ttft_ms, 3), round(row.tpot_ms, 3))
        if key in kept:
            clean.duplicates += 1
            first = kept[key]
            # keep the export that names its configuration (db-dump rows carry InferenceX's config_id)
            if "config_id=" in row.source and "config_id=" not in first.source:
                row.duplicates = [*first.duplicates, first.id]
                kept[key] = row
            else:
                first.duplicates.append(row.id)
            continue
        kept[key] = row
    rows = list(kept.values())
    clean.distinct = len(rows)
    for row in rows:
        row.apart = apart_reason(row, rows)
    clean.apart = sum(1 for r in rows if r.apart)
    return rows, clean


def _row(rec: dict, clean: Cleaning) -> SiliconRow | None:
    tp, moe_tp, moe_ep = (int_cell(rec.get(k)) or 1 for k in ("tp_size", "moe_tp_size", "moe_ep_size"))
    ident = str(rec["id"])
    if tp == MISLABELLED_TP:
        clean.mislabelled.append(ident)
        return None
    fixes: list[str] = []
    ep = moe_ep
    if moe_ep > 1 and moe_tp > 1 and tp == moe_tp * moe_ep:
        fixes.append(f"tp_size {tp} stores TP x EP: ran as --tp {moe_ep} --ep-size {moe_ep}")
        tp = moe_ep
        clean.relabelled += 1
    source = text_cell(rec.get("silicon_data_source"))
    cohort = "gap-analysis" if "gap-analysis" in source or "aic-auto-gap" in source else "inferencex"
    columns = {k: rec.get(k) for k in ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
                                       "moe_ep_size", "gemm_quant_mode", "moe_quant_mode")}
    return SiliconRow(
        id=ident, source=source, cohort=cohort, version=text_cell(rec.get("backend_version")),
        model=str(rec["model_path"]), system=str(rec["system"]),
        precision=text_cell(rec.get("precision")) or "bf16", isl=int(rec["isl"]), osl=int(rec["osl"]),
        concurrency=_concurrency(rec, source), tp=tp, ep=ep, columns=columns,
        ttft_ms=float(rec["silicon_ttft_ms"]), tpot_ms=float(rec["silicon_tpot_ms"]), fixes=fixes)


def _vllm_row(rec: dict) -> SiliconRow:
    """A vLLM row: TP, the experts spread over TP x DP where ``moe_ep_size`` > 1 (vLLM's
    --enable-expert-parallel), DP ranks from ``attention_dp_size`` (vLLM's --data-parallel-size)."""
    tp, dp, moe_ep = (int_cell(rec.get(k)) or 1 for k in ("tp_size", "attention_dp_size", "moe_ep_size"))
    source = text_cell(rec.get("silicon_data_source"))
    cohort = "gap-analysis" if "gap-analysis" in source or "aic-auto-gap" in source else "inferencex"
    columns = {k: rec.get(k) for k in ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
                                       "moe_ep_size", "gemm_quant_mode", "moe_quant_mode")}
    return SiliconRow(
        id=str(rec["id"]), source=source, cohort=cohort, version=text_cell(rec.get("backend_version")),
        model=str(rec["model_path"]), system=str(rec["system"]),
        precision=text_cell(rec.get("precision")) or "bf16", isl=int(rec["isl"]), osl=int(rec["osl"]),
        concurrency=_concurrency(rec, source), tp=tp, ep=moe_ep, columns=columns,
        ttft_ms=float(rec["silicon_ttft_ms"]), tpot_ms=float(rec["silicon_tpot_ms"]), backend="vllm", dp=dp)


def _concurrency(rec: dict, source: str) -> int:
    """The closed loop's stream count: the source's silicon_concurrency (aggregated SGLang rows never use
    attention DP, so it equals batch_size)."""
    m = re.search(r"silicon_concurrency=(\d+)", source)
    return int(m.group(1)) if m else int(rec["batch_size"])


def measured_on(row: SiliconRow) -> str:
    """The date the source says the row was measured ("" where it does not)."""
    m = re.search(r"measured=(\d{4}-\d{2}-\d{2})", row.source)
    return m.group(1) if m else ""


def apart_reason(row: SiliconRow, rows: Iterable[SiliconRow]) -> str:
    """Why ``row`` is replayed and listed but kept out of the errors that judge the model ("" where it is
    not): its measurement holds what no replay of a warm server on its GPU can predict. Either the client
    sent no warm-up (:func:`warmed_up`), or the row is far slower than a twin measured warmed up on a
    GPU whose figures are no higher than its own (:func:`slower_than_a_lesser_gpu`)."""
    if not warmed_up(row):
        return f"{COLD} (before {WARMUP_FROM})"
    return slower_than_a_lesser_gpu(row, rows)


def warmed_up(row: SiliconRow) -> bool:
    """Whether the client sent its warm-up requests before the measured ones. Without them (InferenceX
    before 2026-01-21) the measured means also hold what a server pays once, on its first requests of a
    shape (kernel compilation and autotuning, first-touch allocations): no replay of a warm server
    predicts that, so such rows are scored apart. A row without a date (the gap-analysis runs) counts as
    warmed up."""
    day = measured_on(row)
    return not day or day >= WARMUP_FROM


# The two reasons a row is scored apart, each how its reason text begins (the output's line per reason)
COLD = "measured without warm-up"
SLOWER = "slower than the same launch on a GPU whose figures are no higher"

# A row this many times slower than its twin (TTFT or TPOT) cannot be explained by hardware whose figures
# are no higher: two exports of one configuration on one GPU differ by up to 1.3x in this file
SLOWER_BEYOND = 1.5
FIGURES_WITHIN = 1.05  # "no higher": every figure at most 5 % above the other GPU's


@functools.cache
def _figures(system: str) -> tuple[float, ...]:
    from vocab.hardware import load_hardware

    hw = load_hardware(SYSTEMS[system])
    return hw.peak_tflops_bf16, hw.peak_tflops_fp8, hw.mem_bw_gbs, hw.link_bw_gbs


def no_faster(gpu: str, than: str) -> bool:
    """Whether ``gpu``'s figures (dense BF16 and FP8 FLOPs, memory and link bandwidth) are all no higher
    than ``than``'s (within FIGURES_WITHIN)."""
    return all(a <= FIGURES_WITHIN * b for a, b in zip(_figures(gpu), _figures(than), strict=True))


def slower_than_a_lesser_gpu(row: SiliconRow, rows: Iterable[SiliconRow]) -> str:
    """Why ``row`` contradicts its GPU's figures, or "": its TTFT or TPOT is more than SLOWER_BEYOND times
    that of a twin (the same model, precision, layout, lengths, concurrency and launch flags) measured
    warmed up on another GPU whose figures are no higher. The hardware cannot do that; a release or
    kernel path of the row's own can (InferenceX's B300 runs of SGLang 0.5.10: 8k prompts 4-6x slower
    than the same script's on B200)."""
    try:
        model_for(row)  # a row the replay does not run has no launch known to compare
    except Unreplayable:
        return ""
    if row.system not in SYSTEMS:
        return ""
    flags = launch_flags(row)[0]
    for twin in rows:
        if (twin.system == row.system or twin.system not in SYSTEMS or not warmed_up(twin)
                or (short_model(twin.model), twin.precision, twin.tp, twin.ep, twin.isl, twin.osl,
                    twin.concurrency, twin.cohort) != (short_model(row.model), row.precision, row.tp, row.ep,
                                                       row.isl, row.osl, row.concurrency, row.cohort)
                or launch_flags(twin)[0] != flags or not no_faster(twin.system, row.system)):
            continue
        ratio = max(row.ttft_ms / twin.ttft_ms, row.tpot_ms / twin.tpot_ms)
        if ratio > SLOWER_BEYOND:
            return f"{SLOWER}: {ratio:.1f}x the time on {twin.system} ({twin.id})"
    return ""


class Unreplayable(Exception):
    """A row whose model or GPU the simulated engine does not price; the message says why."""


def model_for(row: SiliconRow, models: tuple = MODELS, unmodelled: tuple = UNMODELLED
              ) -> tuple[str, str | None, str]:
    """(folder under models/, --quantization or None, what the mapping assumes) for ``row``, by the
    ``models`` table (SGLang's rows' by default), refusing what ``unmodelled`` names."""
    key = row.model.lower()
    for pattern, why in unmodelled:
        if re.search(pattern, key):
            raise Unreplayable(why)
    for pattern, precision, folder, quant, note in models:
        if re.search(pattern, key) and row.precision == precision:
            return folder, quant, note
    raise Unreplayable(f"model {row.model} in {row.precision}: no model folder maps to it")


def launch_flags(row: SiliconRow) -> tuple[dict[str, object], list[str]]:
    """The SGLang flags the row's source launched it with, as the replay's ``server_args``, and what is
    assumed. InferenceX's DeepSeek-R1 scripts, read at the commit in effect on the row's date
    (docs/fidelity.md, "Recent served runs"); the gap-analysis runs publish no launch: SGLang's defaults
    for the layout."""
    notes: list[str] = []
    args: dict[str, object] = {"disable_radix_cache": True}
    if row.cohort == "gap-analysis":
        notes.append("launch not published: SGLang's defaults for the layout (radix cache off: the prompts "
                     "share no prefix either way)")
        return args, notes
    if not row.version:
        notes.append("release not recorded (November 2025): the launch flags of the March 2026 script")
    if not warmed_up(row):
        notes.append(f"measured before {WARMUP_FROM}, without the client's warm-up requests: the replayed "
                     "engine has run only its own start-up warm-up")
    if row.system == "h200_sxm":
        cap = 512 if (row.isl, row.osl) == (1024, 1024) else 256
        args |= {"max_running_requests": cap, "cuda_graph_max_bs": cap, "chunked_prefill_size": 32768,
                 "max_prefill_tokens": 32768, "mem_fraction_static": 0.82, "stream_interval": 10}
    elif row.system in ("b200_sxm", "b300_sxm") and row.precision == "fp4":
        args |= {"max_running_requests": 256, "cuda_graph_max_bs": 256, "mem_fraction_static": 0.85,
                 "chunked_prefill_size": 16384, "kv_cache_dtype": "fp8_e4m3", "stream_interval": 10,
                 "scheduler_recv_interval": 10 if row.concurrency < 16 else 30}
    elif row.system in ("b200_sxm", "b300_sxm"):
        if row.tp >= 8:
            args |= {"max_running_requests": 128, "cuda_graph_max_bs": 128, "mem_fraction_static": 0.82,
                     "chunked_prefill_size": 32768, "max_prefill_tokens": 32768}
        else:
            args |= {"max_running_requests": 32, "cuda_graph_max_bs": 32, "mem_fraction_static": 0.95,
                     "chunked_prefill_size": 8192, "max_prefill_tokens": 8192}
        args |= {"kv_cache_dtype": "fp8_e4m3", "stream_interval": 30,
                 "scheduler_recv_interval": 10 if row.concurrency < 16 or row.tp < 8 else 30}
    cap = args.get("max_running_requests")
    if isinstance(cap, int) and row.concurrency > cap:
        # the script's cap would hold C - cap streams back for a whole request each (tens of seconds of
        # TTFT); the rows beyond it measure far less, so they ran with another launch, not published
        notes.append(f"{row.concurrency} streams over the script's --max-running-requests {cap}: launched "
                     f"otherwise (not published); replayed with the cap and graphs at {row.concurrency}")
        args |= {"max_running_requests": row.concurrency, "cuda_graph_max_bs": row.concurrency}
    return args, notes


def client_workload(row: SiliconRow) -> tuple[dict[str, object], list[str]]:
    """The client that measured ``row`` as the corpus's workload (closed loop of C streams, its request
    count, lengths and seed), and what is assumed of it where its source does not publish it."""
    notes: list[str] = []
    gap = row.cohort == "gap-analysis"
    per_stream = GAP_REQUESTS_PER_STREAM if gap else INFERENCEX_REQUESTS_PER_STREAM
    tool, ratio = INFERENCEX_TOOL, INFERENCEX_RANGE_RATIO
    if gap and any(batch in row.source for batch in GAP_VARIED_BATCHES):
        tool = GAP_VARIED_TOOL
        notes.append(f"client not published: closed loop of {row.concurrency} streams, {per_stream}·C "
                     f"requests, lengths uniform in [{INFERENCEX_RANGE_RATIO:g}·L, L] (this batch's TTFTs "
                     "rule out fixed lengths; the spread is benchmark_serving's, assumed)")
    elif gap:
        tool, ratio = GAP_TOOL, 1.0
        notes.append(f"client not published: closed loop of {row.concurrency} streams, {per_stream}·C "
                     "requests of the nominal lengths (fixed lengths as AIConfigurator's aiperf harness "
                     "sends them; the count as InferenceX's)")
    return {"tool": tool, "dataset": "random", "num_prompts": per_stream * row.concurrency,
            "random_input_len": row.isl, "random_output_len": row.osl, "random_range_ratio": ratio,
            "request_rate": "inf", "max_concurrency": row.concurrency, "seed": INFERENCEX_SEED}, notes


def to_entry(row: SiliconRow) -> tuple[Entry, list[str]]:
    """``row`` as a replayable entry (the corpus's format) and what its mapping assumes; raises
    :class:`Unreplayable`."""
    folder, quant, model_note = model_for(row)
    if row.system not in SYSTEMS:
        raise Unreplayable(f"GPU system {row.system}: {NO_PROFILE}")
    args, notes = launch_flags(row)
    if quant:
        args["quantization"] = quant
    notes = [n for n in (model_note, *row.fixes, *notes) if n]
    if row.apart:
        notes.append(f"scored apart: {row.apart}")
    workload, client_notes = client_workload(row)
    notes += client_notes
    entry = Entry.model_validate({
        "id": row.id, "source_url": f"{PREDICTED_SOURCE}: {row.source}", "model": row.model,
        "gpu": GPU_NAMES[row.system], "gpu_count": row.tp, "sglang_version": row.version or "0.5.5",
        "parallelism": {"tp": row.tp, "ep": row.ep}, "server_args": args, "workload": workload,
        "measured": {"mean_ttft_ms": row.ttft_ms, "mean_tpot_ms": row.tpot_ms},
        "parasweep": {"model": folder, "hardware": SYSTEMS[row.system]}})
    return entry, notes


def select(rows: Iterable[R], only: list[str]) -> list[R]:
    """The rows whose id, model or system contains one of ``only`` (all where it is empty)."""
    return [r for r in rows if not only or any(s in r.id or s in r.model or s in r.system for s in only)]
