"""A finding of the diagnosis: what was seen, the evidence, and what to change."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")


@dataclass
class Finding:
    """``id`` is stable across versions (users filter on it); ``evidence`` quotes the numbers."""

    id: str
    severity: Severity
    title: str
    evidence: str
    suggestion: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)
