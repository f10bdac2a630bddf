"""Does what an engine produced match what parasweep reads? A check of finished trial directories.

Written for the first run on a GPU node with real SGLang (``scripts/gpu_first_node.sh``), and run
against the simulated engine in the tests, which must pass it too (it stands in for SGLang). For each
trial directory it checks, and says in one line per difference:

- ``server/server_info.json``: a supported version, and the scheduler's own state
  (``internal_states[0]``: ``effective_max_running_requests_per_dp``, ``pp_max_micro_batch_size``);
- the resolved configuration (``/server_info`` plus the start-up log, read as every trial reads them,
  ``server_log.resolved_config``): every value the diagnosis relies on is there, the decode
  CUDA-graph size included where graphs are on;
- ``server/server.log``: millisecond stamps, every ``Decode batch``/``Prefill batch`` line parsed, and
  decode lines from every pipeline stage;
- ``telemetry/server_metrics.jsonl``: every scheduler gauge the stage series reads, one series per
  pipeline stage (``pp_rank``), labels among those the release attaches;
- ``telemetry/gpu.jsonl``: one GPU per rank of the trial, power, utilisation and energy read.

    python -m orchestrator.engines.sglang_compat.trial_check RUNS_OR_TRIAL_DIR...

prints ``ok``/``DIFFERS`` lines and exits 1 when anything differs (2 when no trial directory is found).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from orchestrator.engines.sglang_compat.versions import (
    NEWEST_KNOWN,
    OLDEST_SUPPORTED,
    release_facts,
    supported,
)
from orchestrator.telemetry.gpu_sampler import read_gpu_samples
from orchestrator.telemetry.server_log import resolved_config, server_log_frame
from orchestrator.telemetry.server_metrics import read_samples
from orchestrator.telemetry.stage_series import GAUGES

# resolved values the diagnosis and the summaries read (analysis/diagnose/, trial/summary.py)
RESOLVED_NEEDED = ("version", "max_running_requests", "max_total_num_tokens", "pp_max_micro_batch_size",
                   "attention_backend", "kv_cache_tokens", "tp_size", "pp_size")
Expect = Callable[[bool, str, str], None]  # (matched?, what matched, what differs)
_STAMP_MS = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}")
_BATCH = re.compile(r"\b(Prefill|Decode) batch\b")


def trial_dirs(paths: Iterable[Path]) -> list[Path]:
    """Trial directories under each path (a trial directory itself, or a runs/ folder holding some):
    those whose engine wrote ``server/server_info.json`` and its process group (not MLflow's copies)."""
    found = []
    for path in paths:
        for info in sorted(path.glob("**/server/server_info.json")):
            if (info.parent / "server.pgid").exists():
                found.append(info.parent.parent)
    return found


def check_trial(trial: Path) -> tuple[list[str], list[str]]:
    """(what matched, what differs) for one trial directory, one line each."""
    ok: list[str] = []
    differ: list[str] = []

    def expect(cond: bool, good: str, bad: str) -> None:
        (ok if cond else differ).append(good if cond else bad)

    info = json.loads((trial / "server" / "server_info.json").read_text())
    version = str(info.get("version", ""))
    known = bool(re.match(r"\d", version))
    expect(known and supported(version), f"version {version}",
           f"version {version!r}: parasweep reads SGLang {OLDEST_SUPPORTED} to {NEWEST_KNOWN}")
    tp, pp = int(info.get("tp_size") or 1), int(info.get("pp_size") or 1)
    dp = int(info.get("dp_size") or 1)
    _check_internal_state(info, expect)

    log_path = trial / "server" / "server.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    resolved = resolved_config(info, log_text)
    missing = [k for k in RESOLVED_NEEDED if resolved.get(k) is None]
    graphs = not info.get("disable_cuda_graph")
    if graphs and resolved.get("cuda_graph_max_bs_decode") is None:
        missing.append("cuda_graph_max_bs_decode")
    expect(not missing, f"resolved values: {', '.join(RESOLVED_NEEDED)}",
           f"resolved values missing: {', '.join(missing)}")
    _check_log(log_path, log_text, pp, expect)
    _check_metrics(trial / "telemetry" / "server_metrics.jsonl", version if known else NEWEST_KNOWN, pp,
                   expect)
    _check_gpus(trial / "telemetry" / "gpu.jsonl", tp * pp * dp, expect)
    return ok, differ


def _check_internal_state(info: dict, expect: Expect) -> None:
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    for key in ("effective_max_running_requests_per_dp", "pp_max_micro_batch_size"):
        expect(state.get(key) is not None, f"/server_info internal_states[0].{key} = {state.get(key)}",
               f"/server_info internal_states[0] has no {key} (keys: {', '.join(sorted(state)[:12])}...)")


def _check_log(path: Path, text: str, pp: int, expect: Expect) -> None:
    lines = text.splitlines()
    stamped = [ln for ln in lines if ln.startswith("[")]
    expect(bool(stamped) and all(_STAMP_MS.match(ln) for ln in stamped[-20:]),
           "server.log stamps carry milliseconds (SGLANG_LOG_MS)",
           "server.log stamps lack milliseconds: SGLANG_LOG_MS was not honoured")
    raw = sum(1 for ln in lines if _BATCH.search(ln))
    frame = server_log_frame(path) if path.exists() else None
    parsed = 0 if frame is None else len(frame)
    expect(raw > 0 and parsed == raw, f"server.log: {parsed} of {raw} batch lines parsed",
           f"server.log: {parsed} of {raw} batch lines parsed (the rest are in a format the parser "
           "does not know)")
    stages = set() if frame is None or frame.empty else set(frame[frame["kind"] == "decode"]["pp"])
    expect(stages == set(range(pp)), f"decode lines from every pipeline stage ({pp})",
           f"decode lines from stages {sorted(stages)} of {pp}")


def _check_metrics(path: Path, version: str, pp: int, expect: Expect) -> None:
    samples = read_samples(path) if path.exists() else None
    if samples is None or samples.empty:
        expect(False, "", "no /metrics samples (telemetry/server_metrics.jsonl)")
        return
    facts = release_facts(version)
    allowed = set(facts.scheduler_labels) | set(facts.scheduler_labels_conditional)
    names = set(samples["name"])
    # the retraction counter appears only once a request was retracted
    for name in (n for n in GAUGES if n != "sglang:num_retracted_requests_total"):
        rows = samples[samples["name"] == name]
        labels = [json.loads(x) for x in rows["labels"]]
        stages = {int(x.get("pp_rank", -1)) for x in labels}
        extra = sorted({k for x in labels for k in x} - allowed)
        expect(name in names and stages == set(range(pp)) and not extra,
               f"/metrics {name}: one series per stage",
               f"/metrics {name}: " + ("absent" if name not in names else
                                       f"pp_rank {sorted(stages)} of {pp}" + (f", labels {extra} unknown"
                                                                               if extra else "")))


def _check_gpus(path: Path, ranks: int, expect: Expect) -> None:
    frame = read_gpu_samples(path) if path.exists() else None
    if frame is None or frame.empty:
        expect(False, "", "no GPU samples (telemetry/gpu.jsonl)")
        return
    gpus = sorted(set(frame["gpu"]))
    expect(len(gpus) == ranks, f"GPU samples of {ranks} GPU(s)", f"GPU samples of {len(gpus)} GPU(s), "
           f"the trial has {ranks} ranks")
    for column in ("power_w", "util_gpu_pct", "energy_j"):
        values = frame[column].astype(float)
        read = float((~values.isna()).mean()) if len(values) else 0.0
        expect(read > 0.9 and not math.isnan(values.max()), f"GPU {column} read ({read:.0%} of samples)",
               f"GPU {column} read in {read:.0%} of samples")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    trials = trial_dirs(Path(a) for a in (args or ["runs"]))
    if not trials:
        where = " ".join(args) or "runs"
        print(f"trial_check: no trial directory with server/server_info.json under {where}")
        return 2
    differs = 0
    for trial in trials:
        ok, differ = check_trial(trial)
        print(f"{trial}:")
        for line in ok:
            print(f"  ok       {line}")
        for line in differ:
            print(f"  DIFFERS  {line}")
        differs += len(differ)
    print(f"trial_check: {len(trials)} trial(s), {differs} difference(s)")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
