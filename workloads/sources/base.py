"""What every source of requests offers: request ``i`` (its token ids and answer length), how many there
are, and what was read and skipped. Each kind of source subclasses :class:`SourceRequests`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vocab.load import Source


@dataclass(frozen=True)
class SourceRequest:
    ids: np.ndarray  # prompt token ids, already within the model's vocabulary
    output_len: int


@dataclass
class SourceRequests:
    """The requests a source offers, with what was skipped and why."""

    source: Source
    seed: int
    vocab_size: int
    count: int = 0  # distinct requests (one pass)
    skipped: dict[str, int] = field(default_factory=dict)
    read: str = ""  # what was read: "17,671 conversations recovered from ..."
    times_s: np.ndarray | None = None  # traces: each kept request's arrival, from the window's start
    session_turns: tuple[int, ...] = ()  # multi-turn: each session's turns, in order

    def request(self, i: int) -> SourceRequest:  # pragma: no cover - each kind overrides it
        raise NotImplementedError

    def messages(self, i: int) -> tuple[dict[str, str], ...]:
        """Request ``i``'s prompt as chat messages (text sources only)."""
        raise ValueError(f"a {self.source.kind} trace has token counts, not text: send it with the "
                         "generate or completions API")

    def summary(self) -> str:
        """One line for the run: what was read, what is sent, what was skipped."""
        skipped = ", ".join(f"{n:,} {why}" for why, n in self.skipped.items() if n)
        unit = "sessions" if self.session_turns else "requests"
        return f"{self.read}; {self.count:,} {unit} kept" + (f" (skipped: {skipped})" if skipped else "")
