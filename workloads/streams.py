"""How each API's stream events are turned into output-token counts.

* ``/generate``: every event carries a cumulative ``meta_info.completion_tokens``; the tokens of
  an event are the difference from the previous event (exact even when the server coalesces
  several tokens into one event, e.g. with ``--stream-interval`` > 1).
* OpenAI ``/v1/completions`` and ``/v1/chat/completions``: with a running ``usage`` on a content
  chunk (``stream_options.continuous_usage_stats``) the tokens are its difference from what was
  counted so far; otherwise each chunk with non-empty ``text`` / ``delta.content`` /
  ``delta.reasoning_content`` counts as one token. The final usage chunk (``choices: []``) gives
  the request's total output tokens but adds no tokens to any chunk (it carries none).

Anything that is not what the API promises raises :class:`StreamError` so the request is
recorded as failed with the right kind; it never takes the point down.
"""

from __future__ import annotations

from typing import Any

import orjson

from vocab.records import PD_TTFT_PARTS

_PD_FIRST = f"sim_pd_{PD_TTFT_PARTS[0]}_s"  # a simulated decode server's meta_info carries the TTFT's parts

class StreamError(Exception):
    """A per-request failure with its ``error_kind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _snippet(payload: bytes, limit: int = 160) -> str:
    text = payload[:limit].decode("utf-8", "replace")
    return " ".join(text.split()) + ("…" if len(payload) > limit else "")


def _load(payload: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise StreamError("malformed", f"invalid JSON in SSE data: {_snippet(payload)}") from None
    if not isinstance(obj, dict):
        raise StreamError("malformed", f"SSE data is not a JSON object: {_snippet(payload)}")
    # SGLang sends {"error": {...}} mid-stream; OpenAI-style servers may send {"object": "error", ...}.
    err = obj.get("error")
    if err is not None or obj.get("object") == "error":
        detail = err if err is not None else obj
        msg = detail.get("message", detail) if isinstance(detail, dict) else detail
        raise StreamError("server_error", f"server error event: {_snippet(str(msg).encode())}")
    return obj


class StreamState:
    """Accumulates one response. ``on_event`` returns the output tokens the event carried."""

    def __init__(self) -> None:
        self.counted = 0  # tokens attributed to chunks so far
        self.total: int | None = None  # server-reported total, when the API gives one
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        # seconds the request waited in the server's queue, as the server reports it (SGLang's
        # /generate meta_info.queue_time, sent when the server runs with --enable-metrics)
        self.server_queue_s: float | None = None
        self.cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache
        # a simulated decode server's account of the TTFT (meta_info.sim_pd_*_s, PD_TTFT_PARTS order)
        self.pd_parts_s: list[float] | None = None

    @property
    def output_tokens(self) -> int:
        return self.total if self.total is not None else self.counted

    def on_event(self, payload: bytes) -> int:
        raise NotImplementedError


class GenerateStream(StreamState):
    """SGLang native ``/generate``: cumulative ``meta_info.completion_tokens``."""

    def _queue_time(self, value: Any) -> None:
        # the latest report wins: a request the engine retracted queues again and the sum grows
        if type(value) in (int, float) and value >= 0:
            self.server_queue_s = float(value)

    def _pd_parts(self, meta: dict[str, Any]) -> None:
        parts = [meta.get(f"sim_pd_{name}_s") for name in PD_TTFT_PARTS]
        if all(type(v) in (int, float) for v in parts):
            self.pd_parts_s = [float(v) for v in parts]  # type: ignore[arg-type]

    def on_event(self, payload: bytes) -> int:
        # Fast path for a well-formed event; anything unusual takes the validating path below.
        try:
            obj = orjson.loads(payload)
            meta = obj["meta_info"]
            cumulative = meta["completion_tokens"]
            if "queue_time" in meta:
                self._queue_time(meta["queue_time"])
            cached = meta.get("cached_tokens")
            if type(cached) is int:
                self.cached_tokens = cached
            if self.pd_parts_s is None and _PD_FIRST in meta:
                self._pd_parts(meta)
            if "error" not in obj and type(cumulative) is int and meta["finish_reason"] is None:
                new = cumulative - self.counted
                if new > 0:
                    self.counted = self.total = cumulative
                    return new
                return 0
        except (orjson.JSONDecodeError, KeyError, TypeError):
            pass
        return self._on_event_checked(payload)

    def _on_event_checked(self, payload: bytes) -> int:
        obj = _load(payload)
        meta = obj.get("meta_info")
        if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
            raise StreamError(
                "malformed", f"/generate event without meta_info.completion_tokens: {_snippet(payload)}"
            )
        cumulative = meta["completion_tokens"]
        new = max(0, cumulative - self.counted)
        self.counted = max(self.counted, cumulative)
        self.total = self.counted
        if isinstance(meta.get("prompt_tokens"), int):
            self.prompt_tokens = meta["prompt_tokens"]
        if "queue_time" in meta:
            self._queue_time(meta["queue_time"])
        if type(meta.get("cached_tokens")) is int:
            self.cached_tokens = meta["cached_tokens"]
        if self.pd_parts_s is None and _PD_FIRST in meta:
            self._pd_parts(meta)
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            self.finish_reason = str(finish.get("type"))
        elif isinstance(finish, str):
            self.finish_reason = finish
        return new


class OpenAIStream(StreamState):
    """``/v1/completions`` (``choices[].text``) or ``/v1/chat/completions`` (``choices[].delta``)."""

    def __init__(self, chat: bool) -> None:
        super().__init__()
        self.chat = chat

    def _has_content(self, choice: Any) -> bool:
        if not isinstance(choice, dict):
            return False
        if self.chat:
            delta = choice.get("delta")
            return isinstance(delta, dict) and bool(delta.get("content") or delta.get("reasoning_content"))
        return bool(choice.get("text"))

    def on_event(self, payload: bytes) -> int:
        obj = _load(payload)
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise StreamError("malformed", f"'choices' is not a list: {_snippet(payload)}")
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason") is not None:
                self.finish_reason = str(choice["finish_reason"])
        usage = obj.get("usage")  # null usage (SGLang completion chunks) means absent
        usage_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details")  # SGLang fills it with --enable-cache-report
            if isinstance(details, dict) and type(details.get("cached_tokens")) is int:
                self.cached_tokens = details["cached_tokens"]
        if not choices:
            # The include_usage chunk: authoritative total, but it carries no token itself.
            if isinstance(usage_tokens, int):
                self.total = usage_tokens
            return 0
        if isinstance(usage_tokens, int):
            # Continuous usage: exact tokens of this chunk, even when tokens were coalesced.
            new = max(0, usage_tokens - self.counted)
            self.counted += new
            return new
        if any(self._has_content(c) for c in choices):
            self.counted += 1
            return 1
        return 0


def make_stream(api: str) -> StreamState:
    if api == "generate":
        return GenerateStream()
    if api in ("completions", "chat"):
        return OpenAIStream(chat=api == "chat")
    raise ValueError(f"unknown api {api!r}")
