"""A tiny SGLang/OpenAI-shaped SSE server that misbehaves on request, for the load generator's tests.

    python tests/fakeserver.py --port 0 [--mode ok|http500|http400|malformed|error_event|cut|hang|notsse]
                               [--every K] [--ttft-ms 5] [--itl-ms 2] [--tokens-per-chunk 1]

It streams the requested number of tokens at a fixed interval in the shapes of SGLang's
``/generate`` (cumulative text/ids, cumulative ``meta_info.completion_tokens``), ``/v1/completions``
and ``/v1/chat/completions`` (role chunk, content chunks, finish chunk, include_usage chunk).
Every ``every``-th generation request misbehaves as ``mode`` says; the others behave. The first
stdout line is ``PORT <n>`` once it listens (``--port 0`` picks a free port); ``GET /health``
answers 200. ``POST /_control`` with a JSON object of the same settings changes them at run time
(and resets the request counter), so one server process can serve many test cases; ``GET /_stats``
returns the counter. Tests start it through ``tests/servers.py``.

This is a protocol fixture, not a performance model: for realistic timing use the simulator, and
for the client's own ceiling the loopback server (``python -m workloads.loopback``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web

MODES = ("ok", "http500", "http400", "malformed", "error_event", "cut", "hang", "notsse")


@dataclass
class Behaviour:
    mode: str = "ok"
    every: int = 1
    ttft_ms: float = 5.0
    itl_ms: float = 2.0
    tokens_per_chunk: int = 1
    model: str = "test-model"


class Routes:
    """The request handlers, sharing one mutable behaviour and request counter."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour
        self.count = 0

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _event(obj: Any) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _misbehaves(self) -> bool:
        self.count += 1
        return self.b.mode != "ok" and self.count % max(1, self.b.every) == 0

    # -- plain endpoints -----------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        m = self.b.model
        data = {"object": "list", "data": [{"id": m, "object": "model", "root": m, "max_model_len": 4096}]}
        return web.json_response(data)

    async def control(self, request: web.Request) -> web.Response:
        data = await request.json()
        for key, value in data.items():
            if not hasattr(self.b, key):
                return web.json_response({"error": f"unknown setting {key}"}, status=400)
            setattr(self.b, key, type(getattr(self.b, key))(value))
        self.count = 0
        return web.json_response(asdict(self.b))

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.count, **asdict(self.b)})

    # -- generation ----------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "generate")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "chat")

    async def _generation(self, request: web.Request, api: str) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
        if api == "generate":
            n = int(body.get("sampling_params", {}).get("max_new_tokens", 128))
            prompt_tokens = len(body.get("input_ids") or str(body.get("text", "")).split())
        elif api == "completions":
            n = int(body.get("max_tokens", 16))
            prompt = body.get("prompt", "")
            prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        else:
            n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        options = body.get("stream_options") or {}
        usage_final = bool(options.get("include_usage"))
        usage_running = bool(options.get("continuous_usage_stats"))

        mode = self.b.mode if self._misbehaves() else "ok"
        if mode == "http500":
            return web.json_response({"error": {"message": "injected internal error"}}, status=500)
        if mode == "http400":
            return web.json_response({"error": {"message": "injected bad request"}}, status=400)
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "notsse":
            return web.json_response({"text": "not a stream"})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rid = f"req-{self.count}"
        created = int(time.time())
        k = max(1, self.b.tokens_per_chunk)
        cut_at = max(1, n // 2)
        ids: list[int] = []
        if api == "chat":
            role = {"role": "assistant", "content": ""}
            await resp.write(self._event(self._chat_chunk(rid, created, role, None, None)))
        await asyncio.sleep(self.b.ttft_ms / 1000.0)
        pending = 0
        for i in range(1, n + 1):
            if i > 1:
                await asyncio.sleep(self.b.itl_ms / 1000.0)
            ids.append(1000 + i)
            pending += 1
            if pending < k and i < n:
                continue
            last = i == n
            usage = self._usage(prompt_tokens, i) if usage_running else None
            delta_text = "".join(f" t{j}" for j in ids[-pending:])
            if api == "generate":
                meta = {
                    "id": rid,
                    "finish_reason": {"type": "length", "length": n} if last else None,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": i,
                    "cached_tokens": 0,
                }
                text = "".join(f" t{j}" for j in ids)
                chunk = self._event({"text": text, "output_ids": list(ids), "meta_info": meta})
            elif api == "completions":
                choice = {
                    "index": 0,
                    "text": delta_text,
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                    "matched_stop": None,
                }
                chunk = self._event(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": self.b.model,
                        "choices": [choice],
                        "usage": usage,
                    }
                )
            else:
                chunk = self._event(self._chat_chunk(rid, created, {"content": delta_text}, None, usage))
            pending = 0
            if mode != "ok" and i >= cut_at:
                await self._misbehave(request, resp, mode, chunk)
                return resp
            await resp.write(chunk)
        if api == "chat":
            await resp.write(self._event(self._chat_chunk(rid, created, {}, "length", None)))
        if usage_final and api != "generate":
            obj = "chat.completion.chunk" if api == "chat" else "text_completion"
            await resp.write(
                self._event(
                    {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": self.b.model,
                        "choices": [],
                        "usage": self._usage(prompt_tokens, n),
                    }
                )
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _misbehave(
        self, request: web.Request, resp: web.StreamResponse, mode: str, chunk: bytes
    ) -> None:
        if mode == "malformed":
            await resp.write(b'data: {"text": this is not json\n\n')
        elif mode == "error_event":
            error = {"message": "injected engine error", "type": "InternalError", "code": 500}
            await resp.write(self._event({"error": error}))
        elif mode == "cut":
            await resp.write(chunk)
            # Drop the connection without the chunked-encoding terminator: a stream cut mid-way.
            if request.transport is not None:
                request.transport.abort()
            return
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    def _chat_chunk(
        self, rid: str, created: int, delta: dict[str, Any], finish: str | None, usage: dict[str, int] | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.b.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            out["usage"] = usage
        return out

    @staticmethod
    def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }


def make_app(behaviour: Behaviour) -> web.Application:
    server = Routes(behaviour)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(
        [
            web.get("/health", server.health),
            web.get("/v1/models", server.models),
            web.post("/generate", server.generate),
            web.post("/v1/completions", server.completions),
            web.post("/v1/chat/completions", server.chat),
            web.post("/_control", server.control),
            web.get("/_stats", server.stats),
        ]
    )
    return app


async def serve(host: str, port: int, behaviour: Behaviour) -> None:
    runner = web.AppRunner(make_app(behaviour), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
    actual = sockets[0].getsockname()[1] if sockets else port
    print(f"PORT {actual}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/fakeserver.py", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mode", choices=MODES, default="ok")
    p.add_argument("--every", type=int, default=1, help="every K-th generation request misbehaves")
    p.add_argument("--ttft-ms", type=float, default=5.0)
    p.add_argument("--itl-ms", type=float, default=2.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--model", default="test-model")
    a = p.parse_args(argv)
    behaviour = Behaviour(a.mode, a.every, a.ttft_ms, a.itl_ms, a.tokens_per_chunk, a.model)
    try:
        import uvloop

        runner_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        runner_factory = None
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=runner_factory) as r:
        r.run(serve(a.host, a.port, behaviour))
    return 0


if __name__ == "__main__":
    sys.exit(main())
