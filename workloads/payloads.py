"""Request generation: what each request of a load point sends.

Split in two so new workloads slot in without touching the HTTP client:

* a *length* source decides input/output lengths per request (``FixedLength`` today; a
  distribution only needs a ``sample(rng)`` method);
* a *prompt* is materialised per request index from ``seed`` and the index alone, so any single
  request can be regenerated without replaying the ones before it (a JSONL prompt file would
  be one more ``kind`` of prompt in :func:`build_request`).

The body is serialised once, before the point starts, so the hot path only sends bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import orjson

Api = Literal["generate", "completions", "chat"]
APIS: tuple[str, ...] = ("generate", "completions", "chat")

ENDPOINTS: dict[str, str] = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}

# Short, common English words: most BPE tokenizers (Llama, Qwen, GPT, DeepSeek/Kimi) encode
# " word" as a single token, so N words ~ N prompt tokens without shipping a tokenizer.
# fmt: off
_WORDS = (
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as",
    "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
    "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each",
    "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then",
    "them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look",
    "two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first",
    "water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get",
    "come", "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work", "know",
    "place", "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name",
    "good", "sentence", "man", "think", "say", "great", "where", "help", "through", "much", "before",
    "line", "right", "too", "mean", "old", "any", "same", "tell", "boy", "follow", "came", "want", "show",
    "also", "around", "form", "three", "small", "set", "put", "end", "does", "another", "well", "large",
    "must", "big", "even", "such", "because", "turn", "here", "why", "ask", "went", "men", "read", "need",
    "land", "different", "home", "us", "move", "try", "kind", "hand", "picture", "again", "change", "off",
    "play", "spell", "air", "away", "animal", "house", "point", "page", "letter", "mother", "answer",
    "found", "study", "still", "learn", "should", "world",
)
# fmt: on


class LengthSource(Protocol):
    """Anything that yields a token length for one request."""

    def sample(self, rng: np.random.Generator) -> int: ...


@dataclass(frozen=True)
class FixedLength:
    """Every request gets exactly ``n`` tokens (the only source used today)."""

    n: int

    def sample(self, rng: np.random.Generator) -> int:
        return self.n


@dataclass(frozen=True)
class RequestSpec:
    """What to send. Every request set is a pure function of these fields and the request index.

    ``model`` is the OpenAI ``model`` field; ``None`` lets :func:`workloads.run_point` ask
    ``GET /v1/models`` once (and omit the field if the server cannot say).
    ``continuous_usage`` asks OpenAI servers for a running ``usage`` on every chunk, which
    gives exact per-chunk token counts when the server coalesces tokens.
    """

    api: Api = "generate"
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    vocab_size: int = 32000
    model: str | None = None
    continuous_usage: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")

    @property
    def path(self) -> str:
        return ENDPOINTS[self.api]

    def input_lengths(self) -> LengthSource:
        return FixedLength(self.input_len)

    def output_lengths(self) -> LengthSource:
        return FixedLength(self.output_len)


@dataclass(frozen=True)
class PreparedRequest:
    """One request ready to send: endpoint path, serialised JSON body and its token budget."""

    index: int
    path: str
    body: bytes
    input_tokens: int
    output_len: int


def _rng(spec: RequestSpec, index: int) -> np.random.Generator:
    # Seeding with (seed, index) makes request i independent of how many came before it.
    return np.random.default_rng([spec.seed, index])


def build_body(spec: RequestSpec, index: int) -> tuple[dict[str, Any], int, int]:
    """The JSON body for request ``index`` plus its (input_tokens, output_len)."""
    rng = _rng(spec, index)
    n_in = spec.input_lengths().sample(rng)
    n_out = spec.output_lengths().sample(rng)
    body: dict[str, Any]
    if spec.api == "generate":
        ids = rng.integers(0, spec.vocab_size, size=n_in).tolist()
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0},
            "stream": True,
        }
    else:
        stream_options: dict[str, Any] = {"include_usage": True}
        if spec.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        if spec.api == "completions":
            # A list of ints is a tokenised prompt in the OpenAI completions API: exact length.
            body = {"prompt": rng.integers(0, spec.vocab_size, size=n_in).tolist(), "max_tokens": n_out}
        else:
            words = rng.choice(len(_WORDS), size=n_in)
            text = " ".join(_WORDS[i] for i in words)
            body = {"messages": [{"role": "user", "content": text}], "max_completion_tokens": n_out}
        body.update({"ignore_eos": True, "temperature": 0, "stream": True, "stream_options": stream_options})
        if spec.model is not None:
            body["model"] = spec.model
    body.update(spec.extra_body)
    return body, n_in, n_out


def build_request(spec: RequestSpec, index: int) -> PreparedRequest:
    body, n_in, n_out = build_body(spec, index)
    return PreparedRequest(index, spec.path, orjson.dumps(body), n_in, n_out)


def build_requests(spec: RequestSpec, count: int) -> list[PreparedRequest]:
    """Requests ``0..count-1``; built up front so serialisation never competes with sending."""
    return [build_request(spec, i) for i in range(count)]
