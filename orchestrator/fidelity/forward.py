"""Published forward-only runs (SGLang's ``bench_one_batch``, earlier ``bench_latency``) replayed on the
simulated engine's step costs, the way that script measures.

``bench_one_batch`` loads the model in one process per TP rank, with no server and no scheduler loop, and
times one static batch: one extend of ``batch x input`` prompt tokens, then ``output - 1`` decode steps.
Every step is timed between two device synchronisations and runs, on the host, one after another:

- the batch's preparation: ``ScheduleBatch.prepare_for_decode`` (``prepare_for_extend`` for the prefill:
  KV slots, sequence lengths), then ``get_model_worker_batch`` and ``ForwardBatch.init_new`` (positions,
  host-to-device copies, the attention backend's metadata, the CUDA graph's input buffers);
- the forward: one CUDA graph replay when the batch is at most the largest captured size, else every
  kernel dispatched eagerly;
- ``model_runner.sample`` (greedy): the logits' argmax outside the graph, then the synchronisation.

Nothing overlaps the host's part with the GPU's: there is no overlap scheduler, and the synchronisation
before each step leaves the GPU idle while the host prepares. The printed "median decode latency" is the
median over the ``output - 1`` steps, whose KV length runs from ``input + 1`` to ``input + output - 1``.

The forward is priced by the engine's own :class:`simulator.costs.CostModel`, built from the launch flags
as the simulated engine builds it (``simulator.predict.load_config``; measured kernel tables where the
hardware profile names them), through its public methods only: anything later added to a step's price
reaches this replay too. The host's part is charged from the same model's ``HostCosts`` (see
:func:`step_parts`). Everything here is a prediction in virtual time: nothing is launched, and no number
is a measurement of this machine.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import UserError
from orchestrator.fidelity.catalog import NotModelled, hardware_profile, model_folder
from orchestrator.fidelity.corpus import read_json_lines
from orchestrator.fidelity.releases import GRAPH_MAX_BS, release
from simulator.costs import BatchShape, CostModel, decode_shape, prefill_shape
from simulator.predict import load_config
from vocab.assets import published_dir

DEFAULT_FILE = "data/published/forward.jsonl"  # the shipped runs (also found outside a checkout)

# the tools whose numbers are bench_one_batch's (lower-cased substrings of ``tool``); the ``_server``
# variant goes through a live server and is refused by name
FORWARD_TOOLS = ("bench_one_batch", "bench_latency", "one_batch")
SERVER_TOOL = "_server"
INFERRED_H100 = "H100"  # an inferred GPU that names H100 among its candidates: priced as an H100 SXM
ROCM_GPU = r"\bamd\b|rocm|instinct|\bmi\d{3}"
# The sampler's kernels a greedy decode launches after the forward, outside the CUDA graph (SGLang's
# Sampler: the argmax over the vocabulary and the ids' cast to int32). Their GPU time is part of the
# head the step costs price; their host dispatch is priced here like any eager kernel's.
SAMPLER_KERNELS = 2
LLAMA3_8B = "meta-llama/Meta-Llama-3-8B"  # the model whose TP8 / TP1 step ratio the summary reports


class ForwardEntry(BaseModel):
    """One published run: the fields the replay reads (every other one, the printed lines and notes
    included, is kept as it is)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    engine: str
    tool: str
    model: str
    gpu: str
    gpu_confidence: str
    n_gpus: int = Field(ge=1)
    tp: int = Field(ge=1)
    ep: int | None = Field(None, ge=1)
    sglang_version: str | None = None
    attention_backend: str | None = None
    cuda_graph: str
    batch_size: int = Field(ge=1)
    input_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    prefill_latency_s: float | None = Field(None, gt=0)
    decode_median_latency_s: float | None = Field(None, gt=0)
    # a folder under models/ and a profile under conf/hardware/ for a model or GPU parasweep's catalogue
    # does not map (as in the serving corpus)
    parasweep: dict[str, str] = Field(default_factory=dict)

    @property
    def eager(self) -> bool:
        """CUDA graphs turned off for the run."""
        return self.cuda_graph.strip().lower().startswith(("off", "disabled"))


def read_forward(path: str | Path) -> list[ForwardEntry]:
    """Every entry of the JSON-lines file at ``path`` (blank lines and lines starting with ``#``
    skipped). Raises :class:`CorpusError` naming the first bad line and field."""
    return read_json_lines(path, ForwardEntry, "--forward")


@dataclass
class ForwardResult:
    """One entry: measured and predicted, in milliseconds; ``skipped`` says why when it was not
    replayed (then nothing is predicted)."""

    id: str
    model: str
    batch: int
    tp: int
    input_len: int
    output_len: int
    graph: bool  # the decode steps replayed from a CUDA graph (as the replay priced them)
    measured_step_ms: float | None
    measured_prefill_ms: float | None
    predicted_step_ms: float | None = None
    predicted_prefill_ms: float | None = None
    # the median decode step's parts (step_parts), ms
    step_parts_ms: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""

    @property
    def step_error(self) -> float | None:
        """predicted / measured - 1 of the median decode step, where both exist."""
        if self.measured_step_ms is None or self.predicted_step_ms is None:
            return None
        return self.predicted_step_ms / self.measured_step_ms - 1.0

    @property
    def prefill_error(self) -> float | None:
        if self.measured_prefill_ms is None or self.predicted_prefill_ms is None:
            return None
        return self.predicted_prefill_ms / self.measured_prefill_ms - 1.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["step_error"] = self.step_error
        out["prefill_error"] = self.prefill_error
        return out


def step_parts(cost: CostModel, shape: BatchShape) -> dict[str, float]:
    """Seconds of one step of ``bench_one_batch`` (decode or extend) of ``shape``, by part, and their
    ``total``. The host parts charged are the ones that script runs; the server's others are not:

    - ``prepare_batch``: ``HostCosts.schedule``. In the server's loop that part is
      ``get_next_batch_to_run`` with a batch, whose work here is ``prepare_for_decode`` (or
      ``prepare_for_extend``): the batch's KV slots and sequence lengths. The server's merge and
      filter of the running batch are in it too; the split of the part is not known, so it is charged
      whole (an upper bound of this script's share).
    - ``forward_batch_init``: ``HostCosts.prepare``: ``get_model_worker_batch``, ``ForwardBatch.init_new``
      and the attention backend's metadata for the replay, up to the launch.
    - ``gpu``, ``comm``, ``dispatch``: the forward as the cost model prices it (``breakdown``): kernels,
      TP collectives, and the host's dispatch not hidden behind them (one graph replay, or an eager
      forward's kernels one by one where the host is the slower side).
    - ``sampling``: the sampler's kernels dispatched after the forward's: after an eager prefill, as
      much of their dispatch as host and GPU do not overlap (all of it at ``prefill_overlap_loss`` 1), and
      what is left of it past the GPU's work; after a decode, only what outlasts the GPU's work.
      The argmax's GPU time is in the head's.

    Both host parts are paid in full: the step starts from a synchronised, idle GPU and nothing overlaps
    them (no overlap scheduler). Not charged: ``poll`` (no request socket), ``process`` (no results
    processed: the ids stay on the GPU for the next step), ``stream`` (no detokenizer), and the PP
    relays (one stage here)."""
    h = cost.host_costs()
    b = shape.seqs
    forward = cost.breakdown(0, shape)
    sampler_host = SAMPLER_KERNELS * (cost.p.host_op_us + cost.hw.kernel_launch_us) * 1e-6
    parts = {"prepare_batch": h.schedule(b), "forward_batch_init": h.prepare(b), "gpu": forward["gpu"],
             "comm": forward["comm"], "dispatch": forward["host_exposed"],
             "sampling": _sampling(cost, forward, sampler_host, not shape.decode)}
    parts["total"] = sum(parts.values())
    return parts


def _check_tool(entry: ForwardEntry) -> None:
    tool = entry.tool.lower()
    if entry.engine.lower() != "sglang":
        raise NotModelled(f"engine {entry.engine!r}: not SGLang's bench_one_batch (vLLM's "
                          "benchmark_latency times a whole generate() call, not a step)")
    if SERVER_TOOL in tool:
        raise NotModelled("bench_one_batch_server goes through a live server (HTTP, scheduler): not a "
                          "forward-only step")
    if not any(t in tool for t in FORWARD_TOOLS):
        raise NotModelled(f"tool {entry.tool!r}: not SGLang's bench_one_batch")
    if re.search(ROCM_GPU, entry.gpu.lower()):
        raise NotModelled(f"GPU {entry.gpu}: AMD ROCm GPUs have no hardware profile")
    if re.search(r"torch[.-]compile", entry.cuda_graph.lower()):
        raise NotModelled("torch.compile (--enable-torch-compile): its compiled kernels are not modelled")
    if entry.decode_median_latency_s is None and entry.prefill_latency_s is None:
        raise NotModelled("no median decode step or prefill printed")


def _model(entry: ForwardEntry) -> tuple[Path, str]:
    return model_folder(entry.model, entry.parasweep.get("model"))


def _hardware(entry: ForwardEntry) -> tuple[Path, str]:
    own = entry.parasweep.get("hardware")
    if own or entry.gpu_confidence != "inferred":
        return hardware_profile(entry.gpu, own), ""
    # an inferred GPU naming H100 among its candidates is priced as the H100 SXM ("Hopper-class
    # (H100/H200)" included: the catalogue would read H200 there)
    gpu = INFERRED_H100 if INFERRED_H100.lower() in entry.gpu.lower() else entry.gpu
    path = hardware_profile(gpu, None)
    return path, f"GPU inferred, not stated ({entry.gpu}): priced as {path.stem}"


def _argv(entry: ForwardEntry, notes: list[str]) -> list[str]:
    """The simulated engine's launch flags for the run (raises NotModelled)."""
    _check_tool(entry)
    model, model_note = _model(entry)
    profile, gpu_note = _hardware(entry)
    notes += [n for n in (model_note, gpu_note) if n]
    if entry.tp > entry.n_gpus:
        raise NotModelled(f"tp {entry.tp} needs more than the {entry.n_gpus} GPUs published")
    argv = ["--model-path", str(model), "--sim-hardware", str(profile), "--sim-step-costs", "auto",
            "--tp-size", str(entry.tp), "--ep-size", str(entry.ep or 1)]
    backend = re.search(r"\b(fa3|flashinfer|triton)\b", (entry.attention_backend or "").lower())
    if backend:
        argv += ["--attention-backend", backend.group(1)]
    if entry.eager:
        argv.append("--disable-cuda-graph")
    v = release(entry.sglang_version)
    if v is not None and v.major == 0 and v.minor < 5:
        # the largest captured decode batch of the release the run was measured on
        argv += ["--cuda-graph-max-bs-decode", str(GRAPH_MAX_BS)]
        notes.append(f"SGLang {v} captured CUDA graphs up to batch {GRAPH_MAX_BS}")
    return argv


def replay_forward(entry: ForwardEntry) -> ForwardResult:
    """``entry`` replayed as ``bench_one_batch`` measured it; a run parasweep cannot model comes back
    with ``skipped`` set to the reason."""
    def ms(s: float | None) -> float | None:
        return None if s is None else s * 1e3

    result = ForwardResult(id=entry.id, model=entry.model, batch=entry.batch_size, tp=entry.tp,
                           input_len=entry.input_len, output_len=entry.output_len, graph=False,
                           measured_step_ms=ms(entry.decode_median_latency_s),
                           measured_prefill_ms=ms(entry.prefill_latency_s))
    try:
        argv = _argv(entry, result.notes)
        try:
            cfg = load_config(argv)
        except ValueError as e:
            raise NotModelled(f"the simulated engine refuses this launch: {e}") from None
    except NotModelled as e:
        result.skipped = str(e)
        return result
    cost = cfg.cost
    result.notes.append(f"step costs: {cfg.step_costs.label()}")
    b, isl, osl = entry.batch_size, entry.input_len, entry.output_len
    if entry.prefill_latency_s is not None:
        result.predicted_prefill_ms = step_parts(cost, prefill_shape([(isl, 0)] * b))["total"] * 1e3
    if osl >= 2:
        # decode step i (0-based) attends over input + 1 + i tokens: i = 0 .. output - 2
        steps = [step_parts(cost, decode_shape([isl + 1 + i] * b)) for i in range(osl - 1)]
        result.predicted_step_ms = statistics.median(s["total"] for s in steps) * 1e3
        result.step_parts_ms = {k: v * 1e3 for k, v in steps[(osl - 1) // 2].items()}
        result.graph = cost.uses_cuda_graph(decode_shape([isl + 1] * b))
    return result


def median_abs_step_error(results: list[ForwardResult]) -> float | None:
    """The median |predicted / measured - 1| of the decode step over the replayed entries."""
    errors = [abs(e) for e in (r.step_error for r in results) if e is not None]
    return statistics.median(errors) if errors else None


def tp_step_ratio(results: list[ForwardResult], model: str = LLAMA3_8B) -> tuple[float, float] | None:
    """(measured, predicted) batch-1 decode step at TP8 over TP1 for ``model``, CUDA graphs on, each TP
    size's entries averaged; None without both."""
    def mean(tp: int, which: str) -> float | None:
        vals = [getattr(r, which) for r in results
                if r.model == model and r.batch == 1 and r.tp == tp and r.graph and not r.skipped
                and r.step_error is not None]
        return statistics.fmean(vals) if vals else None

    m8, m1 = mean(8, "measured_step_ms"), mean(1, "measured_step_ms")
    p8, p1 = mean(8, "predicted_step_ms"), mean(1, "predicted_step_ms")
    if m8 is None or m1 is None or p8 is None or p1 is None:
        return None
    return m8 / m1, p8 / p1


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _err(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def table(results: list[ForwardResult]) -> str:
    """The replayed entries: measured and predicted median decode step (and prefill where printed)."""
    lines = [f"{'entry':52} {'batch':>5} {'tp':>3} {'in/out':>10} {'graph':>5} {'step ms':>8} "
             f"{'predicted':>9} {'error':>6}  {'prefill ms':>10} {'predicted':>9} {'error':>6}"]
    for r in results:
        if r.skipped:
            continue
        lines.append(f"{r.id[:52]:52} {r.batch:>5} {r.tp:>3} {f'{r.input_len}/{r.output_len}':>10} "
                     f"{'on' if r.graph else 'off':>5} {_num(r.measured_step_ms):>8} "
                     f"{_num(r.predicted_step_ms):>9} {_err(r.step_error):>6}  "
                     f"{_num(r.measured_prefill_ms):>10} {_num(r.predicted_prefill_ms):>9} "
                     f"{_err(r.prefill_error):>6}")
    return "\n".join(lines)


def summary_lines(results: list[ForwardResult]) -> list[str]:
    replayed = [r for r in results if not r.skipped]
    steps = [r for r in replayed if r.step_error is not None]
    out = [f"replayed {len(replayed)} of {len(results)} entries; {len(steps)} with a median decode step"]
    med = median_abs_step_error(results)
    if med is not None:
        out.append(f"decode step: median |error| {100 * med:.0f} % over {len(steps)} entries "
                   "(predicted against measured)")
    ratio = tp_step_ratio(results)
    if ratio is not None:
        out.append(f"{LLAMA3_8B} batch-1 step, TP8 / TP1: measured {ratio[0]:.2f}, predicted {ratio[1]:.2f}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator fidelity --forward",
        description="Published SGLang bench_one_batch runs replayed on the simulated engine's step costs "
                    "(predictions, not measurements of this machine).")
    p.add_argument("file", nargs="?", default=DEFAULT_FILE, metavar="FILE",
                   help=f"JSON lines of published forward-only runs (default: {DEFAULT_FILE})")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write the results as JSON to OUT")
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json_out and not Path(args.json_out).resolve().parent.is_dir():
        parser.error(f"--json {args.json_out}: invalid; valid: a file in an existing folder")
    path = args.file
    if path == DEFAULT_FILE and not Path(path).is_file():
        path = str(published_dir() / "forward.jsonl")
    try:
        entries = read_forward(path)
    except UserError as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    print(f"fidelity: {len(entries)} published forward-only run(s) of {path} replayed on the simulated "
          "engine's step costs (predicted, not measured here)", flush=True)
    results = [replay_forward(e) for e in entries]
    print(table(results))
    print("(step = bench_one_batch's median decode latency; error = predicted / measured - 1)")
    for r in results:
        if r.skipped:
            print(f"skipped {r.id}: {r.skipped}")
    for r in results:
        if r.notes and not r.skipped:
            print(f"assumed for {r.id}: " + "; ".join(r.notes))
    print()
    for line in summary_lines(results):
        print(line)
    if args.json_out:
        out = {"results": [r.as_json() for r in results], "summary": summary_lines(results),
               "median_abs_step_error": median_abs_step_error(results),
               "tp8_over_tp1": tp_step_ratio(results)}
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"written: {args.json_out}")
    return 0


def _sampling(cost: CostModel, forward: dict[str, float], sampler_host: float, prefill: bool) -> float:
    """The sampler's dispatch a step pays (``step_parts``)."""
    beyond = max(0.0, forward["host"] + sampler_host - forward["total"])
    if not (forward["eager"] and prefill):
        return beyond
    loss = cost.p.prefill_overlap_loss
    return loss * sampler_host + (1.0 - loss) * beyond
