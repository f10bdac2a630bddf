"""A finding of the diagnosis: what was seen, the evidence, what to change, and what that change is
predicted to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
# what a finding's change is for, and so what its prediction is judged on: output tokens per second,
# or one latency metric (p99 inter-token latency, p99 time to first token)
Goal = Literal["throughput", "itl_p99_ms", "ttft_p99_ms"]
GOALS: tuple[str, ...] = ("throughput", "itl_p99_ms", "ttft_p99_ms")
# findings about the measurement itself (the client fell behind, the trial failed): no configuration
# change answers them, so none is searched for
ABOUT_THE_MEASUREMENT: tuple[str, ...] = ("client_bound", "trial_failed")


@dataclass
class Finding:
    """``id`` is stable across versions (users filter on it); ``evidence`` quotes the numbers and names
    their source.

    ``change`` is the suggestion as config overrides (``{"pp.micro_batch_size": 4}``; an environment
    variable for the engine as ``{"env.NAME": value}``), empty when the advice is not a config change.
    ``alternatives`` are further changes worth predicting when ``change`` turns out not to help.
    ``point`` is the load point the finding is about; ``predicted_effect`` is filled in by the check
    that predicts each suggestion before it is made (see ``orchestrator/trial/advice.py``), which
    judges it on ``goal``. ``more_load`` is a concurrency at which the same configuration is worth
    predicting, for what it needs to fill: said apart, never as the fix (a user seldom chooses the
    traffic).
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    suggestion: str
    point: str = ""
    change: dict[str, Any] = field(default_factory=dict)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    predicted_effect: dict[str, Any] | None = None
    goal: Goal = "throughput"
    more_load: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")
        if self.goal not in GOALS:
            raise ValueError(f"goal must be one of {', '.join(GOALS)}, got {self.goal!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
