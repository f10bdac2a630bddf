"""Request generation: what each request of a load point sends.

* Lengths come from the spec's length distributions (``RequestSpec.input_lengths()`` /
  ``output_lengths()``), from a prompt file's rows, or from a source of real traffic
  (``workloads/sources/``: ShareGPT, Mooncake and Azure traces).
* Every request is materialised from ``(seed, index)`` alone, so any single request can be
  regenerated without replaying the ones before it.

:func:`build_request` serialises a body once; the load generator builds them before the point
starts (see :func:`workloads.shard.prepare_requests`), so the hot path only sends bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from vocab.load import RequestSpec
from vocab.prompts import Prompt, load_prompts

from .sources import source_requests

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
    if spec.source is not None:
        return _body_from_source(spec, index)
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


def request_ids(spec: RequestSpec, index: int) -> tuple[np.ndarray, int, int] | None:
    """Request ``index``'s prompt token ids and its (input_tokens, output_len), drawn as
    :func:`build_body` draws them but without building the body, where the request is token ids the
    body carries as they are: random prompts or a dataset's ids to ``generate`` or ``completions``
    (None otherwise: text, a prompt file, or extra body fields that could change what is sent)."""
    if spec.api not in ("generate", "completions") or spec.extra_body or spec.prompt_file is not None:
        return None
    if spec.source is not None:
        req = source_requests(spec).request(index)
        return np.asarray(req.ids, dtype=np.int64), len(req.ids), req.output_len
    rng = _rng(spec, index)
    n_in = spec.input_lengths().sample(rng)
    n_out = spec.output_lengths().sample(rng)
    return rng.integers(0, spec.vocab_size, size=n_in), n_in, n_out


def prompt_ids(spec: RequestSpec, index: int) -> np.ndarray | None:
    """Request ``index``'s prompt token ids, where the client sends ids (None: it sends text, which the
    server tokenizes)."""
    fast = request_ids(spec, index)
    if fast is not None:
        return fast[0]
    body, _, _ = build_body(spec, index)
    ids = body.get("input_ids", body.get("prompt"))
    return np.asarray(ids, dtype=np.int64) if isinstance(ids, list) else None


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


def _body_from_source(spec: RequestSpec, index: int) -> tuple[dict[str, Any], int, int]:
    source = source_requests(spec)
    req = source.request(index)
    body: dict[str, Any]
    if spec.api == "generate":
        body = {"input_ids": req.ids.tolist()}
    elif spec.api == "completions":
        body = {"prompt": req.ids.tolist()}
    else:  # the same turns as text; the server's chat template and tokenizer count them
        body = {"messages": [dict(m) for m in source.messages(index)]}
    return _finish_body(spec, body, req.output_len), len(req.ids), req.output_len


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
