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

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
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
    """Every request gets exactly ``n`` tokens."""

    n: int

    def sample(self, rng: np.random.Generator) -> int:
        return self.n

    @property
    def mean(self) -> float:
        return float(self.n)


DISTRIBUTIONS = ("fixed", "uniform", "normal", "exponential", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    """A length distribution around a nominal length ``n`` (its mean, up to clipping at 1).

    ``kind:param`` as written on the command line:

    * ``fixed``: always ``n``.
    * ``uniform:R``: integers uniform in ``[n(1-R), n(1+R)]`` (0 <= R <= 1; mean ``n``).
    * ``normal:CV``: normal with mean ``n`` and standard deviation ``CV * n``, rounded.
    * ``exponential``: exponential with mean ``n``, rounded up (heavy on short lengths).
    * ``lognormal:SIGMA``: lognormal with mean ``n`` and log-space sigma ``SIGMA`` (long tail).

    Every sample is clipped to ``[1, max_len]`` when ``max_len`` is set (else ``[1, inf)``).
    """

    n: int
    kind: str = "fixed"
    param: float = 0.0
    max_len: int | None = None

    @classmethod
    def parse(cls, text: str, n: int, max_len: int | None = None) -> LengthDist:
        kind, _, param = text.strip().partition(":")
        if kind not in DISTRIBUTIONS:
            raise ValueError(f"length distribution must be one of {', '.join(DISTRIBUTIONS)}, got {text!r}")
        needs = kind in ("uniform", "normal", "lognormal")
        if needs and not param:
            raise ValueError(f"{kind} needs a parameter, e.g. {kind}:0.5")
        if not needs and param:
            raise ValueError(f"{kind} takes no parameter, got {text!r}")
        try:
            value = float(param) if param else 0.0
        except ValueError:
            raise ValueError(f"bad parameter in {text!r}") from None
        if kind == "uniform" and not 0 <= value <= 1:
            raise ValueError("uniform:R needs 0 <= R <= 1")
        if kind in ("normal", "lognormal") and not value > 0:
            raise ValueError(f"{kind} needs a positive parameter")
        return cls(n, kind, value, max_len)

    def sample(self, rng: np.random.Generator) -> int:
        n, kind, p = self.n, self.kind, self.param
        if kind == "fixed":
            v = float(n)
        elif kind == "uniform":
            lo, hi = round(n * (1 - p)), round(n * (1 + p))
            v = float(rng.integers(lo, hi + 1))
        elif kind == "normal":
            v = round(rng.normal(n, p * n))
        elif kind == "exponential":
            v = math.ceil(rng.exponential(n))
        else:  # lognormal with mean n: mu = ln(n) - sigma^2 / 2
            v = round(rng.lognormal(math.log(n) - p * p / 2, p))
        out = max(1, int(v))
        return min(out, self.max_len) if self.max_len else out

    @property
    def mean(self) -> float:
        """The nominal mean (before clipping)."""
        return float(self.n)


@dataclass(frozen=True)
class Prompt:
    """One row of a prompt file: exactly one of ``text``, ``input_ids`` or ``messages``."""

    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    output_len: int | None = None
    input_len: int | None = None  # declared prompt tokens (else len(input_ids) or a word count)


@functools.lru_cache(maxsize=8)
def _load_prompts(path: str, mtime: float) -> tuple[Prompt, ...]:
    rows: list[Prompt] = []
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
            out_len = obj.get("output_len", obj.get("max_tokens"))
            in_len = obj.get("input_len")
            if out_len is not None and not (isinstance(out_len, int) and out_len >= 1):
                raise ValueError(f"{path}:{lineno}: output_len must be a positive integer")
            if "input_ids" in obj:
                ids = obj["input_ids"]
                if not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
                    raise ValueError(f"{path}:{lineno}: input_ids must be a non-empty list of ints")
                rows.append(Prompt(input_ids=tuple(ids), output_len=out_len, input_len=in_len or len(ids)))
            elif "messages" in obj:
                msgs = obj["messages"]
                if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) for m in msgs)):
                    raise ValueError(f"{path}:{lineno}: messages must be a non-empty list of objects")
                words = sum(len(str(m.get("content", "")).split()) for m in msgs)
                rows.append(Prompt(messages=tuple(msgs), output_len=out_len, input_len=in_len or words))
            elif isinstance(obj.get("prompt", obj.get("text")), str):
                text = obj.get("prompt", obj.get("text"))
                rows.append(Prompt(text=text, output_len=out_len, input_len=in_len or len(text.split())))
            else:
                raise ValueError(
                    f"{path}:{lineno}: needs one of 'prompt' (or 'text'), 'input_ids', 'messages'"
                )
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return tuple(rows)


def load_prompts(path: str | Path) -> tuple[Prompt, ...]:
    """The rows of a JSONL prompt file (cached while the file is unchanged)."""
    p = Path(path)
    try:
        mtime = p.stat().st_mtime
    except OSError as e:
        raise ValueError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    return _load_prompts(str(p), mtime)


@dataclass(frozen=True)
class RequestSpec:
    """What to send. Every request set is a pure function of these fields and the request index.

    ``model`` is the OpenAI ``model`` field; ``None`` lets :func:`workloads.run_point` ask
    ``GET /v1/models`` once (and omit the field if the server cannot say).
    ``continuous_usage`` asks OpenAI servers for a running ``usage`` on every chunk, which
    gives exact per-chunk token counts when the server coalesces tokens.
    ``input_dist`` / ``output_dist`` draw each request's lengths around ``input_len`` /
    ``output_len`` (see :class:`LengthDist`; ``fixed`` by default).
    ``prompt_file`` takes prompts from a JSONL file instead (row ``index % rows``, or a
    seeded shuffle with ``shuffle_prompts``); a row's ``output_len`` overrides ``output_len``.
    """

    api: Api = "generate"
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    vocab_size: int = 32000
    model: str | None = None
    continuous_usage: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    input_dist: str = "fixed"
    output_dist: str = "fixed"
    prompt_file: str | None = None
    shuffle_prompts: bool = False

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.input_len < 1 or self.output_len < 1:
            raise ValueError("input_len and output_len must be >= 1")
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self.input_lengths()
        self.output_lengths()
        if self.prompt_file is not None:
            rows = load_prompts(self.prompt_file)
            if self.api == "chat" and any(r.input_ids is not None for r in rows):
                raise ValueError("prompt rows given as input_ids cannot be sent to the chat API")

    @property
    def path(self) -> str:
        return ENDPOINTS[self.api]

    def input_lengths(self) -> LengthDist:
        return LengthDist.parse(self.input_dist, self.input_len)

    def output_lengths(self) -> LengthDist:
        return LengthDist.parse(self.output_dist, self.output_len)


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
    if spec.prompt_file is not None:
        return _body_from_file(spec, index, rng)
    n_in = spec.input_lengths().sample(rng)
    n_out = spec.output_lengths().sample(rng)
    body: dict[str, Any]
    if spec.api == "generate":
        ids = rng.integers(0, spec.vocab_size, size=n_in).tolist()
        body = {"input_ids": ids}
    elif spec.api == "completions":
        # A list of ints is a tokenised prompt in the OpenAI completions API: exact length.
        body = {"prompt": rng.integers(0, spec.vocab_size, size=n_in).tolist()}
    else:
        words = rng.choice(len(_WORDS), size=n_in)
        text = " ".join(_WORDS[i] for i in words)
        body = {"messages": [{"role": "user", "content": text}]}
    return _finish_body(spec, body, n_out), n_in, n_out


def _body_from_file(
    spec: RequestSpec, index: int, rng: np.random.Generator
) -> tuple[dict[str, Any], int, int]:
    rows = load_prompts(spec.prompt_file)  # type: ignore[arg-type]
    if spec.shuffle_prompts:
        # One seeded permutation per pass over the file: every row once per len(rows) requests.
        n_pass, pos = divmod(index, len(rows))
        row = rows[int(np.random.default_rng([spec.seed, n_pass, 1]).permutation(len(rows))[pos])]
    else:
        row = rows[index % len(rows)]
    n_out = row.output_len if row.output_len is not None else spec.output_lengths().sample(rng)
    n_in = int(row.input_len or 0)
    body: dict[str, Any]
    if spec.api == "generate":
        body = {"input_ids": list(row.input_ids)} if row.input_ids is not None else {"text": _as_text(row)}
    elif spec.api == "completions":
        body = {"prompt": list(row.input_ids) if row.input_ids is not None else _as_text(row)}
    else:
        user = [{"role": "user", "content": _as_text(row)}]
        msgs = list(row.messages) if row.messages is not None else user
        body = {"messages": msgs}
    return _finish_body(spec, body, n_out), n_in, n_out


def _as_text(row: Prompt) -> str:
    if row.text is not None:
        return row.text
    if row.messages is not None:
        return "\n".join(str(m.get("content", "")) for m in row.messages)
    raise ValueError("a prompt given as input_ids cannot be sent to the chat API")


def _finish_body(spec: RequestSpec, body: dict[str, Any], n_out: int) -> dict[str, Any]:
    if spec.api == "generate":
        body["sampling_params"] = {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0}
        body["stream"] = True
    else:
        stream_options: dict[str, Any] = {"include_usage": True}
        if spec.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body["max_tokens" if spec.api == "completions" else "max_completion_tokens"] = n_out
        body.update({"ignore_eos": True, "temperature": 0, "stream": True, "stream_options": stream_options})
        if spec.model is not None:
            body["model"] = spec.model
    body.update(spec.extra_body)
    return body


def build_request(spec: RequestSpec, index: int) -> PreparedRequest:
    body, n_in, n_out = build_body(spec, index)
    return PreparedRequest(index, spec.path, orjson.dumps(body), n_in, n_out)


def build_requests(spec: RequestSpec, count: int) -> list[PreparedRequest]:
    """Requests ``0..count-1``; built up front so serialisation never competes with sending."""
    return [build_request(spec, i) for i in range(count)]
