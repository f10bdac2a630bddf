"""The simulator has no tokenizer: prompt lengths are estimated and generated text is a placeholder.

* A text prompt counts as ceil(characters / 4) tokens (the usual ~4 characters per BPE token of English
  text); a token-id prompt counts exactly.
* A chat prompt counts its messages' contents the same way, plus 4 tokens of template per message and
  3 for the assistant header (what Llama-3/Qwen chat templates add per turn, roughly).
* Each generated token id maps to one short word, so streamed text grows by one word per token.

The live server's handlers and the prediction's virtual client both count prompts with these
functions, so a prediction sees the prompt lengths the server would.
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


def generate_prompt_lengths(body: dict) -> tuple[list[int], bool]:
    """``POST /generate``: the token count of each prompt (``input_ids`` exactly, ``text`` estimated) and
    whether the body is a batch."""
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        return ([len(x) for x in ids] if batch else [len(ids)]), batch
    if body.get("text") is not None:
        text = body["text"]
        batch = isinstance(text, list)
        return ([count_text_tokens(t) for t in text] if batch else [count_text_tokens(text)]), batch
    raise ValueError("Either text or input_ids should be provided.")


def completion_prompt_lengths(prompt: object) -> list[int]:
    """``POST /v1/completions``: the token count of each prompt (a text, token ids, or a list of either)."""
    if prompt is None or prompt == "" or prompt == []:
        raise ValueError("prompt is required")
    if isinstance(prompt, str):
        return [count_text_tokens(prompt)]
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        return [len(prompt)]
    if isinstance(prompt, list) and all(isinstance(x, str) for x in prompt):
        return [count_text_tokens(p) for p in prompt]
    if isinstance(prompt, list) and all(isinstance(x, list) for x in prompt):
        return [len(p) for p in prompt]
    raise ValueError("prompt must be a string, a list of strings or a list of token ids")


def count_chat_tokens(messages: list) -> int:
    n = 3
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else str(m)
        if isinstance(content, list):  # OpenAI content parts: count the text parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        n += 4 + (count_text_tokens(content) if content else 0)
    return n


def detokenize(ids: list[int], start: int = 0) -> str:
    pieces = _PIECES
    k = len(pieces)
    return "".join(pieces[t % k] for t in ids[start:])
