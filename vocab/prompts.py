"""Prompt files: JSONL rows a load point can send instead of generated prompts."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


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
