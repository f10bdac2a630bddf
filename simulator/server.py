"""SGLang's HTTP API (sglang.md section 2) on aiohttp, driving the engine model in live mode."""

from __future__ import annotations

import asyncio
import gc
import itertools
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable

import orjson
from aiohttp import web

from simulator.clock import LiveDriver, Simulation
from simulator.engine import Engine, Request
from simulator.logs import LogWriter, startup_lines
from simulator.metrics import Metrics
from simulator.observer import Reporter
from simulator.resolve import SimConfig
from simulator.text import count_chat_tokens, count_text_tokens, detokenize

HEALTH_TIMEOUT_S = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT default
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
DONE = b"data: [DONE]\n\n"


class BadRequest(Exception):
    pass


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _openai_error(msg: str, status: int = 400) -> web.Response:
    return _json({"object": "error", "message": msg, "type": "BadRequestError", "param": None,
                  "code": status}, status)


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _Waiter:
    """One future at a time, resolved by the engine's ``notify`` (no polling)."""

    __slots__ = ("fut", "loop", "only_on_finish", "reqs")

    def __init__(self, loop: asyncio.AbstractEventLoop, reqs: list[Request], only_on_finish: bool) -> None:
        self.loop = loop
        self.fut: asyncio.Future | None = None
        self.reqs = reqs
        self.only_on_finish = only_on_finish
        for r in reqs:
            r.notify = self.wake

    def wake(self) -> None:
        fut = self.fut
        if fut is None or fut.done():
            return
        if self.only_on_finish and not all(r.finished for r in self.reqs):
            return
        fut.set_result(None)

    async def wait(self) -> None:
        self.fut = self.loop.create_future()
        try:
            await self.fut
        finally:
            self.fut = None


class SimServer:
    def __init__(self, cfg: SimConfig, loop: asyncio.AbstractEventLoop, log: LogWriter) -> None:
        self.cfg = cfg
        self.loop = loop
        self.log = log
        self.sim = Simulation()
        self.driver = LiveDriver(self.sim, loop, cfg.time_scale)
        log.wall = time.time
        self.engines: list[Engine] = []
        for dp_rank in range(cfg.dp):
            self.engines.append(Engine(cfg, self.sim, dp_rank))
        self.metrics: Metrics | None = None
        if cfg.args.enable_metrics:
            self.metrics = Metrics(cfg, self.engines, self.driver.now, lambda: self.driver.lag)
        for dp_rank, eng in enumerate(self.engines):
            eng.observer = Reporter(cfg, log, self.metrics, dp_rank)
            eng.output_hook = self._on_output
        self._rr = itertools.cycle(range(cfg.dp))
        self._rid_seq = itertools.count(1)
        self._output_waiters: list[asyncio.Future] = []
        self.ready = False
        self.app = self._make_app()

    # -- plumbing ---------------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.ready_handler)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/set_internal_state", self.set_internal_state)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_get("/metrics", self.metrics_handler)
        return app

    def _on_output(self) -> None:
        if self._output_waiters:
            for f in self._output_waiters:
                if not f.done():
                    f.set_result(None)
            self._output_waiters.clear()

    def _new_request(self, input_len: int, max_new: int, stream: bool, log_metrics: bool = True) -> Request:
        cfg = self.cfg
        if input_len >= cfg.context_len:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the model's context length "
                f"({cfg.context_len} tokens)."
            )
        if input_len > cfg.max_req_input_len:
            raise BadRequest(
                f"The input ({input_len} tokens) is longer than the maximum request input length "
                f"({cfg.max_req_input_len} tokens) allowed by the KV cache."
            )
        if max_new < 0:
            raise BadRequest("max_new_tokens must be at least 0")
        if input_len + max_new > cfg.context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {cfg.context_len} "
                f"tokens. You requested a total of {input_len + max_new} tokens: {input_len} tokens from "
                f"the input messages and {max_new} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit."
            )
        seq = next(self._rid_seq)
        return Request(uuid.uuid4().hex, input_len, max(max_new, 1), cfg.random_seed * 1_000_003 + seq,
                       stream=stream, log_metrics=log_metrics)

    def _submit(self, reqs: list[Request]) -> None:
        now = self.driver.now()
        for req in reqs:
            self.engines[next(self._rr)].submit(req, now)

    def _abort(self, reqs: list[Request]) -> None:
        for r in reqs:
            if not r.finished:
                self.engines[0 if self.cfg.dp == 1 else self._engine_of(r)].abort(r)

    def _engine_of(self, req: Request) -> int:
        for i, eng in enumerate(self.engines):
            if req in eng.waiting or any(req in s.reqs for s in eng.slots) or eng.chunked_req is req:
                return i
        return 0

    async def _outputs(self, reqs: list[Request], request: web.Request) -> AsyncIterator[list[int]]:
        """Yield, each time some request has new tokens, the indices of those requests, until all finish."""
        waiter = _Waiter(self.loop, reqs, only_on_finish=False)
        sent = [0] * len(reqs)
        done = [False] * len(reqs)
        try:
            while not all(done):
                ready = []
                for i, r in enumerate(reqs):
                    if done[i]:
                        continue
                    n = len(r.output_ids)
                    if n > sent[i] or r.finished:
                        ready.append(i)
                        sent[i] = n
                        if r.finished:
                            done[i] = True
                if ready:
                    yield ready
                else:
                    await waiter.wait()
        finally:
            for r in reqs:
                r.notify = None
            if not all(done):
                self._abort(reqs)

    async def _wait_all(self, reqs: list[Request], request: web.Request) -> None:
        waiter = _Waiter(self.loop, reqs, only_on_finish=True)
        try:
            while not all(r.finished for r in reqs):
                await waiter.wait()
        finally:
            for r in reqs:
                r.notify = None
            if not all(r.finished for r in reqs):
                self._abort(reqs)

    # -- health / info ------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        # As SGLang: a real 1-token generation; any output reaching the frontend after it starts counts.
        probe = self._new_request(1, 1, stream=False, log_metrics=False)
        fut = self.loop.create_future()
        self._output_waiters.append(fut)
        self._submit([probe])
        try:
            await asyncio.wait_for(fut, HEALTH_TIMEOUT_S)
        except TimeoutError:
            self.log.warning(
                f"Health check failed. Server couldn't get a response from detokenizer for last "
                f"{HEALTH_TIMEOUT_S:.0f} seconds."
            )
            return web.Response(status=503)
        return web.Response(status=200)

    async def ready_handler(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        info = self.cfg.server_info()
        info["launch_command"] = " ".join([sys.executable, "-m", "simulator", *sys.argv[1:]])
        for state, eng in zip(info["internal_states"], self.engines, strict=True):
            state["last_gen_throughput"] = eng.last_gen_throughput
            state["effective_max_running_requests_per_dp"] = eng.pool_size
        info["pp_max_micro_batch_size"] = self.engines[0].cap
        # Wall-clock epoch of simulated t = 0: wall = sim_wall_origin + t / sim_time_scale. With
        # meta_info.sim_token_time a client can compare each chunk's arrival to the model's schedule.
        info["sim_wall_origin"] = self.driver.wall(0.0)
        return _json(info)

    async def model_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return _json({
            "model_path": cfg.args.model_path,
            "served_model_name": cfg.served_model_name,
            "tokenizer_path": cfg.args.tokenizer_path or cfg.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": cfg.args.load_format,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.spec.model_type,
            "architectures": [cfg.spec.architecture],
        })

    async def models(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return _json({"object": "list", "data": [{
            "id": cfg.served_model_name, "object": "model", "created": int(cfg.startup_time),
            "owned_by": "sglang", "root": cfg.args.model_path, "parent": None,
            "max_model_len": cfg.context_len,
        }]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there "
                                 "are running or waiting requests, the operation will not be performed.)\n")

    async def set_internal_state(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        args = (body or {}).get("server_args", {})
        updated = False
        if "pp_max_micro_batch_size" in args:
            v = args["pp_max_micro_batch_size"]
            hi = max(self.cfg.max_running_requests // self.cfg.pp, 1)
            if isinstance(v, int) and 1 <= v <= hi:
                for eng in self.engines:
                    eng.cap = v
                updated = True
        return _json({"updated": updated, "server_args": {"pp_max_micro_batch_size": self.engines[0].cap}})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise web.HTTPNotFound()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- /generate ----------------------------------------------------------------------------------------

    def _meta(self, req: Request, received: float, n: int) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": req.finish_reason if req.finished and n == len(req.output_ids) else None,
            "prompt_tokens": req.input_len,
            "completion_tokens": n,
            "cached_tokens": 0,
            "weight_version": "default",
            "num_retractions": 0,
            "e2e_latency": time.time() - received,
        }
        if self.cfg.args.enable_metrics:
            meta["request_received_ts"] = received
        # The model's own clock (simulated seconds, immune to wall-clock jitter): for diagnosis and tests.
        if req.first_token_time >= 0:
            meta["sim_first_token_latency"] = req.first_token_time - req.arrival
        if req.finished and req.finish_time >= 0:
            meta["sim_e2e_latency"] = req.finish_time - req.arrival
        if n and req.last_token_time >= 0:
            meta["sim_token_time"] = req.last_token_time  # simulated time the latest token was emitted
        return meta

    async def generate(self, request: web.Request) -> web.StreamResponse:
        received = time.time()
        try:
            body = await request.json(loads=orjson.loads)
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            sp = body.get("sampling_params") or {}
            max_new = sp.get("max_new_tokens")
            max_new = 128 if max_new is None else int(max_new)
            stream = bool(body.get("stream", False))
            if body.get("input_ids") is not None:
                ids = body["input_ids"]
                batch = bool(ids) and isinstance(ids[0], list)
                lens = [len(x) for x in ids] if batch else [len(ids)]
            elif body.get("text") is not None:
                if self.cfg.args.skip_tokenizer_init:
                    raise BadRequest("text input requires a tokenizer; the server runs with "
                                     "--skip-tokenizer-init, send input_ids instead")
                text = body["text"]
                batch = isinstance(text, list)
                lens = [count_text_tokens(t) for t in text] if batch else [count_text_tokens(text)]
            else:
                raise BadRequest("Either text or input_ids should be provided.")
            if not lens or min(lens) == 0:
                raise BadRequest("The input is empty.")
            reqs = [self._new_request(n, max_new, stream) for n in lens]
        except (BadRequest, ValueError, TypeError) as e:
            return _json({"error": {"message": str(e)}}, 400)
        self._submit(reqs)
        with_text = not self.cfg.args.skip_tokenizer_init
        if not stream:
            await self._wait_all(reqs, request)
            outs = [self._generate_obj(r, received, len(r.output_ids), with_text) for r in reqs]
            return _json(outs if batch else outs[0])
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        texts = [""] * len(reqs)
        tlen = [0] * len(reqs)
        try:
            async for ready in self._outputs(reqs, request):
                parts = []
                for i in ready:
                    r = reqs[i]
                    n = len(r.output_ids)
                    if with_text:  # cumulative text, extended incrementally
                        texts[i] += detokenize(r.output_ids[tlen[i]:n])
                        tlen[i] = n
                    obj = {"text": texts[i], "output_ids": r.output_ids[:n],
                           "meta_info": self._meta(r, received, n)}
                    if batch:
                        obj["index"] = i
                    parts.append(_sse(obj))
                await resp.write(b"".join(parts))
            await resp.write(DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(reqs)
            raise
        return resp

    def _generate_obj(self, r: Request, received: float, n: int, with_text: bool) -> dict:
        return {"text": detokenize(r.output_ids[:n]) if with_text else "", "output_ids": r.output_ids[:n],
                "meta_info": self._meta(r, received, n)}

    # -- OpenAI -------------------------------------------------------------------------------------------

    @staticmethod
    def _include_usage(body: dict) -> bool:
        so = body.get("stream_options") or {}
        return bool(so.get("include_usage"))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json(loads=orjson.loads)
            prompt = body.get("prompt")
            if prompt is None or prompt == "" or prompt == []:
                raise BadRequest("prompt is required")
            if isinstance(prompt, str):
                lens = [count_text_tokens(prompt)]
            elif isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
                lens = [len(prompt)]
            elif isinstance(prompt, list) and all(isinstance(x, str) for x in prompt):
                lens = [count_text_tokens(p) for p in prompt]
            elif isinstance(prompt, list) and all(isinstance(x, list) for x in prompt):
                lens = [len(p) for p in prompt]
            else:
                raise BadRequest("prompt must be a string, a list of strings or a list of token ids")
            max_new = body.get("max_tokens")
            max_new = 16 if max_new is None else int(max_new)
            stream = bool(body.get("stream", False))
            reqs = [self._new_request(n, max_new, stream) for n in lens]
        except (BadRequest, ValueError, TypeError, AttributeError) as e:
            return _openai_error(str(e))
        return await self._openai(request, body, reqs, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json(loads=orjson.loads)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages must be a non-empty list")
            max_new = body.get("max_completion_tokens")
            if max_new is None:
                max_new = body.get("max_tokens")
            max_new = 128 if max_new is None else int(max_new)
            stream = bool(body.get("stream", False))
            reqs = [self._new_request(count_chat_tokens(messages), max_new, stream)]
        except (BadRequest, ValueError, TypeError, AttributeError) as e:
            return _openai_error(str(e))
        return await self._openai(request, body, reqs, chat=True)

    async def _openai(self, request: web.Request, body: dict, reqs: list[Request], chat: bool
                      ) -> web.StreamResponse:
        self._submit(reqs)
        model = body.get("model") or self.cfg.served_model_name
        created = int(time.time())
        rid = reqs[0].rid
        if not body.get("stream", False):
            await self._wait_all(reqs, request)
            return _json(self._openai_full(reqs, rid, created, model, chat))
        obj_name = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj_name, "created": created, "model": model}
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        sent = [0] * len(reqs)
        try:
            if chat:
                await resp.write(_sse({**head, "choices": [{
                    "index": 0, "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                    "logprobs": None, "finish_reason": None, "matched_stop": None}]}))
            async for ready in self._outputs(reqs, request):
                parts = []
                for i in ready:
                    r = reqs[i]
                    n = len(r.output_ids)
                    delta = detokenize(r.output_ids[sent[i]:n])
                    sent[i] = n
                    final = r.finished and n == len(r.output_ids)
                    reason = _openai_reason(r) if final else None
                    if chat:
                        if delta:
                            parts.append(_sse({**head, "choices": [{
                                "index": i, "delta": {"content": delta}, "logprobs": None,
                                "finish_reason": None, "matched_stop": None}]}))
                        if final:
                            parts.append(_sse({**head, "choices": [{
                                "index": i, "delta": {}, "logprobs": None, "finish_reason": reason,
                                "matched_stop": None}]}))
                    else:
                        parts.append(_sse({**head, "choices": [{
                            "index": i, "text": delta, "logprobs": None, "finish_reason": reason,
                            "matched_stop": None}], "usage": None}))
                if parts:
                    await resp.write(b"".join(parts))
            if self._include_usage(body):
                await resp.write(_sse({**head, "choices": [], "usage": _usage(reqs)}))
            await resp.write(DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(reqs)
            raise
        return resp

    def _openai_full(self, reqs: list[Request], rid: str, created: int, model: str, chat: bool) -> dict:
        choices = []
        for i, r in enumerate(reqs):
            text = detokenize(r.output_ids)
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text,
                                                        "reasoning_content": None, "tool_calls": None},
                                "logprobs": None, "finish_reason": _openai_reason(r), "matched_stop": None})
            else:
                choices.append({"index": i, "text": text, "logprobs": None,
                                "finish_reason": _openai_reason(r), "matched_stop": None})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model, "choices": choices, "usage": _usage(reqs)}


def _openai_reason(r: Request) -> str:
    fr = r.finish_reason or {}
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(fr.get("type", ""), "stop")


def _usage(reqs: list[Request]) -> dict:
    p = sum(r.input_len for r in reqs)
    c = sum(len(r.output_ids) for r in reqs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": None}


async def _run(cfg: SimConfig, log: LogWriter) -> int:
    loop = asyncio.get_running_loop()
    server = SimServer(cfg, loop, log)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.args.host, cfg.args.port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        print(f"OSError: cannot bind {cfg.args.host}:{cfg.args.port}: {e}", file=sys.stderr, flush=True)
        await runner.cleanup()
        return 1
    server.ready = True
    # Startup objects (config, model spec, aiohttp app) never die: keep them out of the collector's
    # full passes, which otherwise grow with them and show up as multi-ms stalls in token timing.
    gc.collect()
    gc.freeze()
    log.info("The server is fired up and ready to roll!")
    await stop.wait()
    server.ready = False
    server.driver.stop()
    await runner.shutdown()
    await runner.cleanup()
    return 0


def serve(cfg: SimConfig) -> int:
    log = LogWriter(cfg.args.log_level)
    startup_lines(cfg, log)
    runner: Callable = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a declared dependency on Linux
        pass
    try:
        return runner(_run(cfg, log))
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
