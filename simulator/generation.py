"""The generation endpoints, ``POST /generate`` (SGLang's native API) and ``POST /v1/completions`` /
``POST /v1/chat/completions`` (OpenAI's), with SGLang's request defaults, stream formats and error
bodies (docs/simulator.md, "Endpoints"). Prompts are counted by ``text.py``; requests go through the
``Frontend``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from simulator.disagg.live import Bootstrap
from simulator.entities import Request
from simulator.faults import HTTP_ERROR, HTTP_ERROR_MESSAGE, FaultInjector, StreamTap
from simulator.frontend import BadRequest, Frontend
from simulator.sim_config import SimConfig
from simulator.text import chat_prompt, completion_prompts, detokenize, generate_prompts

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
DONE = b"data: [DONE]\n\n"


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def openai_error(msg: str, status: int = 400, err_type: str = "BadRequestError") -> web.Response:
    return json_response({"object": "error", "message": msg, "type": err_type, "param": None,
                          "code": status}, status)


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class KVConnector(Protocol):
    """vLLM's KV connector on the OpenAI endpoints (``simulator/vllm/nixl.py``): it reads a request's
    ``kv_transfer_params`` and adds its own to a finished request's answer."""

    def accept(self, body: dict[str, Any], request_id: str | None, req: Request) -> None: ...

    def answer(self, req: Request) -> dict[str, Any]: ...


class GenerationAPI:
    def __init__(self, cfg: SimConfig, frontend: Frontend, faults: FaultInjector,
                 epoch: Callable[[float], float], connector: KVConnector | None = None) -> None:
        self.cfg = cfg
        self.frontend = frontend
        self.epoch = epoch  # simulated time -> epoch seconds of the engine's own clock
        self.faults = faults  # counts arrivals; may crash or freeze the engine (--sim-fault-*)
        self.connector = connector

    def _now(self) -> float:
        """The engine's clock now, as epoch seconds."""
        return self.epoch(self.frontend.now())

    # -- /generate ----------------------------------------------------------------------------------------

    def _meta(self, req: Request, received: float, n: int) -> dict:
        meta = {
            "id": req.rid,
            "finish_reason": req.finish_reason if req.finished and n == len(req.output_ids) else None,
            "prompt_tokens": req.input_len,
            "completion_tokens": n,
            "cached_tokens": req.cached,
            "weight_version": "default",
            "num_retractions": 0,
            "e2e_latency": self._now() - received,
        }
        sd = self.cfg.speculative
        if sd is not None and req.spec_verify_ct > 0:  # as SGLang 0.5.23's tokenizer manager reports them
            proposed = req.spec_verify_ct * (sd.params.num_draft_tokens - 1)
            meta["spec_accept_rate"] = req.spec_correct_drafts / proposed if proposed else 0.0
            meta["spec_accept_length"] = n / req.spec_verify_ct
            meta["spec_num_correct_drafts"] = req.spec_correct_drafts
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = req.spec_verify_ct
        if self.cfg.args.enable_metrics:
            # the scheduler's own timing of the request, as SGLang 0.5.23 reports it with metrics on:
            # seconds in the waiting queue, and the epochs of its first forward and of its prefill's end,
            # all on the engine's own clock (F times the wall clock's pace at --sim-time-scale F)
            meta["request_received_ts"] = received
            if req.forward_entry >= 0:
                meta["queue_time"] = req.forward_entry - req.arrival
                meta["forward_entry_time"] = self.epoch(req.forward_entry)
            if req.first_token_time >= 0:
                meta["prefill_finished_time"] = self.epoch(req.first_token_time)
        # The model's own clock (simulated seconds, immune to wall-clock jitter): for diagnosis and tests.
        if req.first_token_time >= 0:
            meta["sim_first_token_latency"] = req.first_token_time - req.arrival
        if req.finished and req.finish_time >= 0:
            meta["sim_e2e_latency"] = req.finish_time - req.arrival
        if n and req.last_token_time >= 0:
            meta["sim_token_time"] = req.last_token_time  # simulated time the latest token was emitted
        if req.pd is not None and req.first_token_time >= 0:  # a decode server: its TTFT's parts
            meta.update({f"sim_pd_{part}_s": value for part, value in req.pd.parts().items()})
            meta["sim_pd_transfer_bytes"] = req.pd.transfer_bytes
        return meta

    async def generate(self, request: web.Request) -> web.StreamResponse:
        received = self._now()
        fault = self.faults.arrive()
        try:
            body = await request.json(loads=orjson.loads)
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            sp = body.get("sampling_params") or {}
            max_new = sp.get("max_new_tokens")
            max_new = 128 if max_new is None else int(max_new)
            stream = bool(body.get("stream", False))
            if body.get("input_ids") is None and body.get("text") is not None \
                    and self.cfg.args.skip_tokenizer_init:
                raise BadRequest("text input requires a tokenizer; the server runs with "
                                 "--skip-tokenizer-init, send input_ids instead")
            prompts, batch = generate_prompts(body)
            if not prompts or min(len(p) for p in prompts) == 0:
                raise BadRequest("The input is empty.")
            reqs = [self.frontend.new_request(p, max_new, stream) for p in prompts]
        except (BadRequest, ValueError, TypeError) as e:
            return json_response({"error": {"message": str(e)}}, 400)
        if fault == HTTP_ERROR:
            return json_response({"error": {"message": HTTP_ERROR_MESSAGE}}, 500)
        self.frontend.submit(reqs, Bootstrap.of(body))
        with_text = not self.cfg.args.skip_tokenizer_init
        if not stream:
            await self.frontend.wait_all(reqs)
            outs = [self._generate_obj(r, received, len(r.output_ids), with_text) for r in reqs]
            return json_response(outs if batch else outs[0])
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        tap = StreamTap(fault, request, resp, lambda: self.frontend.abort(reqs))
        texts = [""] * len(reqs)
        tlen = [0] * len(reqs)
        try:
            async for ready in self.frontend.outputs(reqs):
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
                if not await tap.write(b"".join(parts), all(r.finished for r in reqs)):
                    return resp  # an injected stall or cut ended the stream
            await resp.write(DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self.frontend.abort(reqs)
            raise
        return resp

    def _generate_obj(self, r: Request, received: float, n: int, with_text: bool) -> dict:
        return {"text": detokenize(r.output_ids[:n]) if with_text else "", "output_ids": r.output_ids[:n],
                "meta_info": self._meta(r, received, n)}

    # -- OpenAI ---------------------------------------------------------------------------------------------

    @staticmethod
    def _include_usage(body: dict) -> bool:
        so = body.get("stream_options") or {}
        return bool(so.get("include_usage"))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        fault = self.faults.arrive()
        try:
            body = await request.json(loads=orjson.loads)
            prompts = completion_prompts(body.get("prompt"))
            max_new = body.get("max_tokens")
            max_new = 16 if max_new is None else int(max_new)
            stream = bool(body.get("stream", False))
            reqs = [self.frontend.new_request(p, max_new, stream) for p in prompts]
        except (BadRequest, ValueError, TypeError, AttributeError) as e:
            return openai_error(str(e))
        return await self._openai(request, body, reqs, chat=False, fault=fault)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        fault = self.faults.arrive()
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
            reqs = [self.frontend.new_request(chat_prompt(messages), max_new, stream)]
        except (BadRequest, ValueError, TypeError, AttributeError) as e:
            return openai_error(str(e))
        return await self._openai(request, body, reqs, chat=True, fault=fault)

    def _usage(self, reqs: list[Request]) -> dict:
        p = sum(r.input_len for r in reqs)
        c = sum(len(r.output_ids) for r in reqs)
        # with --enable-cache-report SGLang 0.5.22+ always reports the cached prompt tokens, 0 included
        details = ({"cached_tokens": sum(r.cached for r in reqs)} if self.cfg.args.enable_cache_report
                   else None)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": details}

    async def _openai(self, request: web.Request, body: dict, reqs: list[Request], chat: bool,
                      fault: str | None) -> web.StreamResponse:
        if fault == HTTP_ERROR:
            return openai_error(HTTP_ERROR_MESSAGE, 500, "InternalServerError")
        if self.connector is not None:
            for r in reqs:
                self.connector.accept(body, request.headers.get("X-Request-Id"), r)
        self.frontend.submit(reqs, Bootstrap.of(body))
        model = body.get("model") or self.cfg.served_model_name
        created = int(time.time())
        rid = reqs[0].rid
        if not body.get("stream", False):
            await self.frontend.wait_all(reqs)
            full = self._openai_full(reqs, rid, created, model, chat)
            if self.connector is not None:  # vLLM's answer carries the connector's parameters at its top
                full.update(self.connector.answer(reqs[0]))
            return json_response(full)
        obj_name = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj_name, "created": created, "model": model}
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        tap = StreamTap(fault, request, resp, lambda: self.frontend.abort(reqs))
        sent = [0] * len(reqs)
        try:
            if chat:
                await resp.write(_sse({**head, "choices": [{
                    "index": 0, "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                    "logprobs": None, "finish_reason": None, "matched_stop": None}]}))
            async for ready in self.frontend.outputs(reqs):
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
                if parts and not await tap.write(b"".join(parts), all(r.finished for r in reqs)):
                    return resp  # an injected stall or cut ended the stream
            if self._include_usage(body):
                await resp.write(_sse({**head, "choices": [], "usage": self._usage(reqs)}))
            await resp.write(DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self.frontend.abort(reqs)
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
                "model": model, "choices": choices, "usage": self._usage(reqs)}


def _openai_reason(r: Request) -> str:
    fr = r.finish_reason or {}
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(fr.get("type", ""), "stop")
