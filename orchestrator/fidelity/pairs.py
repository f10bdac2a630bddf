"""Published pairs of one engine's layouts on the same GPUs (pipeline against tensor parallelism), each
run replayed the way it was measured, and the question a user asks of them: does the prediction put the
two in the measured order?

A pair is the entries of one ``pair`` in a corpus file (``data/published/vllm_pp.jsonl``: vLLM's published
PP-vs-TP runs that parasweep can express, each with its source); each is replayed by ``replay.predict``
(the simulated engine playing vLLM for an entry of ``"engine": "vllm"``), and the metric the source
published for both is compared: which layout is ahead, and by how much, measured and predicted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.fidelity.catalog import NotModelled
from orchestrator.fidelity.corpus import Entry

DEFAULT_PAIRS = Path("data/published/vllm_pp.jsonl")
METRICS = ("output_throughput", "request_throughput")  # what the sources publish, first that both have


@dataclass(frozen=True)
class Side:
    id: str
    layout: str  # TP2 PP4
    measured: float
    predicted: float | None
    why_none: str = ""


@dataclass(frozen=True)
class Pair:
    name: str
    metric: str
    sides: tuple[Side, ...]

    @property
    def measured_order(self) -> list[str]:
        return [s.layout for s in sorted(self.sides, key=lambda s: -s.measured)]

    @property
    def predicted_order(self) -> list[str] | None:
        if any(s.predicted is None for s in self.sides):
            return None
        return [s.layout for s in sorted(self.sides, key=lambda s: -(s.predicted or 0.0))]

    @property
    def right(self) -> bool | None:
        order = self.predicted_order
        return None if order is None else order == self.measured_order


def read_pairs(path: Path) -> dict[str, list[Entry]]:
    """The entries of ``path`` grouped by their ``pair``; a one-line UserError for a file that is not one."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        entries = [Entry.model_validate(json.loads(ln)) for ln in lines]
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0]
        raise UserError(f"--pairs {path}: cannot read it as a corpus of entries ({first})") from None
    pairs: dict[str, list[Entry]] = {}
    for e in entries:
        name = getattr(e, "pair", None)
        if not name:
            raise UserError(f"--pairs {path}: entry {e.id} names no pair")
        pairs.setdefault(str(name), []).append(e)
    return pairs


def judge(name: str, entries: list[Entry]) -> Pair:
    """Every run of one pair replayed, on the first metric all of them published."""
    from orchestrator.fidelity.replay import predict

    metric = next((m for m in METRICS if all(m in e.measured for e in entries)), None)
    if metric is None:
        raise UserError(f"pair {name}: no metric of {', '.join(METRICS)} published for every run")
    sides = []
    for e in entries:
        layout = f"TP{e.parallelism.tp}" + (f" PP{e.parallelism.pp}" if e.parallelism.pp > 1 else "")
        try:
            _, predicted = predict(e)
            sides.append(Side(e.id, layout, float(e.measured[metric]), float(predicted[metric])))
        except NotModelled as exc:
            sides.append(Side(e.id, layout, float(e.measured[metric]), None, str(exc)))
    return Pair(name, metric, tuple(sides))


def lines(pair: Pair) -> list[str]:
    out = [f"{pair.name} ({pair.metric}):"]
    for s in pair.sides:
        pred = f"{s.predicted:,.2f}" if s.predicted is not None else f"not predicted: {s.why_none}"
        out.append(f"  {s.layout:10} measured {s.measured:>10,.2f}   predicted {pred}")
    verdict = {True: "right", False: "WRONG", None: "not judged"}[pair.right]
    out.append(f"  order: measured {' > '.join(pair.measured_order)}; predicted "
               f"{' > '.join(pair.predicted_order or ['-'])}: {verdict}")
    return out


def run_pairs(path: str | None, json_out: str | None) -> int:
    """``python -m orchestrator fidelity --pairs [FILE]``."""
    file = Path(path) if path else DEFAULT_PAIRS
    if not path and not file.is_file():  # installed outside a checkout
        from vocab.assets import published_dir

        file = published_dir() / DEFAULT_PAIRS.name
    pairs = read_pairs(file)
    print(f"fidelity: {len(pairs)} published layout pair(s) of {file}, each run replayed on the simulated "
          "engine (predictions in virtual time, not measurements)", flush=True)
    judged = [judge(name, entries) for name, entries in pairs.items()]
    for pair in judged:
        print("\n".join(lines(pair)))
    right = sum(1 for p in judged if p.right)
    print(f"ordering right on {right} of {sum(1 for p in judged if p.right is not None)} pair(s) judged")
    if json_out:
        Path(json_out).write_text(json.dumps([{"pair": p.name, "metric": p.metric, "right": p.right,
                                               "sides": [s.__dict__ for s in p.sides]} for p in judged],
                                             indent=1) + "\n")
    return 0
