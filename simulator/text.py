"""The simulator has no tokenizer: prompt lengths are estimated and generated text is a placeholder.

* A text prompt counts as ceil(characters / 4) tokens (the usual ~4 characters per BPE token of English
  text), each a stand-in id of its 4 characters, so equal beginnings give equal ids (the prefix cache
  matches them); a token-id prompt is taken as sent.
* A chat prompt counts its messages' contents the same way, plus 4 tokens of template per message and
  3 for the assistant header (what Llama-3/Qwen chat templates add per turn, roughly).
* Each generated token id maps to one short word, so streamed text grows by one word per token.

The live server's handlers and the prediction's virtual client both read prompts with these
functions, so a prediction sees the prompts the server would.
"""

from __future__ import annotations

import zlib

import numpy as np

_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "was", "be", "by",
    "this", "are", "or", "from", "at", "an", "which", "but", "not", "have", "has", "one", "all", "they",
    "can", "more", "will", "time", "model", "token", "stage", "batch", "pipeline", "tensor", "expert",
)
_PIECES = tuple(" " + w for w in _WORDS)


def count_text_tokens(text: str) -> int:
    return max(1, -(-len(text) // 4))


def _piece_id(piece: str) -> int:
    # stable across processes (unlike hash()): equal texts give equal ids in the server and the prediction
    return zlib.crc32(piece.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF


def text_ids(text: str) -> np.ndarray:
    """A text's stand-in token ids: one per 4 characters (``count_text_tokens`` of them), so texts that
    share a beginning share their first ids, as a tokenizer's would (what the prefix cache matches)."""
    if not text:
        return np.array([_piece_id("")], dtype=np.int64)
    return np.fromiter((_piece_id(text[i:i + 4]) for i in range(0, len(text), 4)), dtype=np.int64,
                       count=count_text_tokens(text))


def _ids(x: list[int]) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def generate_prompts(body: dict) -> tuple[list[np.ndarray], bool]:
    """``POST /generate``: each prompt's token ids (``input_ids`` as sent, ``text`` by ``text_ids``) and
    whether the body is a batch."""
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        return ([_ids(x) for x in ids] if batch else [_ids(ids)]), batch
    if body.get("text") is not None:
        text = body["text"]
        batch = isinstance(text, list)
        return ([text_ids(t) for t in text] if batch else [text_ids(text)]), batch
    raise ValueError("Either text or input_ids should be provided.")


def completion_prompts(prompt: object) -> list[np.ndarray]:
    """``POST /v1/completions``: each prompt's token ids (a text, token ids, or a list of either)."""
    if prompt is None or prompt == "" or prompt == []:
        raise ValueError("prompt is required")
    if isinstance(prompt, str):
        return [text_ids(prompt)]
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        return [_ids(prompt)]
    if isinstance(prompt, list) and all(isinstance(x, str) for x in prompt):
        return [text_ids(p) for p in prompt]
    if isinstance(prompt, list) and all(isinstance(x, list) for x in prompt):
        return [_ids(p) for p in prompt]
    raise ValueError("prompt must be a string, a list of strings or a list of token ids")


def chat_prompt(messages: list) -> np.ndarray:
    """A chat's token ids: per message 3 template ids before its content and 1 after (4 per message),
    then 3 for the assistant's header: what Llama-3/Qwen chat templates add per turn, roughly. A
    conversation sent again with one more turn starts with the same ids."""
    parts: list[np.ndarray] = []
    for m in messages:
        role = m.get("role", "user") if isinstance(m, dict) else "user"
        content = m.get("content", "") if isinstance(m, dict) else str(m)
        if isinstance(content, list):  # OpenAI content parts: count the text parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(_ids([_piece_id("<|start|>"), _piece_id(str(role)), _piece_id("<|sep|>")]))
        if content:
            parts.append(text_ids(content))
        parts.append(_ids([_piece_id("<|end|>")]))
    parts.append(_ids([_piece_id("<|start|>"), _piece_id("assistant"), _piece_id("<|sep|>")]))
    return np.concatenate(parts)


def detokenize(ids: list[int], start: int = 0) -> str:
    pieces = _PIECES
    k = len(pieces)
    return "".join(pieces[t % k] for t in ids[start:])
