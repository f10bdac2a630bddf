"""The simulator has no tokenizer: prompt lengths are estimated and generated text is a placeholder.

* A text prompt counts as ceil(characters / 4) tokens (the usual ~4 characters per BPE token of English
  text); a token-id prompt counts exactly.
* A chat prompt counts its messages' contents the same way, plus 4 tokens of template per message and
  3 for the assistant header (what Llama-3/Qwen chat templates add per turn, roughly).
* Each generated token id maps to one short word, so streamed text grows by one word per token.
"""

from __future__ import annotations

_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "was", "be", "by",
    "this", "are", "or", "from", "at", "an", "which", "but", "not", "have", "has", "one", "all", "they",
    "can", "more", "will", "time", "model", "token", "stage", "batch", "pipeline", "tensor", "expert",
)
_PIECES = tuple(" " + w for w in _WORDS)


def count_text_tokens(text: str) -> int:
    return max(1, -(-len(text) // 4))


def count_chat_tokens(messages: list) -> int:
    n = 3
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else str(m)
        if isinstance(content, list):  # OpenAI content parts: count the text parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        n += 4 + (count_text_tokens(content) if content else 0)
    return n


def token_text(token_id: int) -> str:
    return _PIECES[token_id % len(_PIECES)]


def detokenize(ids: list[int], start: int = 0) -> str:
    pieces = _PIECES
    k = len(pieces)
    return "".join(pieces[t % k] for t in ids[start:])
