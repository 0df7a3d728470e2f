"""The OpenAI-compatible HTTP API on aiohttp (SPEC §4).

Every client mistake becomes a 4xx with an OpenAI error body before any SSE byte is sent; a
client that goes away (mid-stream or while waiting) aborts its request, so its KV blocks
return to the pool at once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .async_engine import AsyncEngine, EngineFailure
from .errors import InvalidRequest
from .metrics import ServerMetrics
from .openai_api import (ChatRequest, chunk, completion_response, error_body, new_completion_id, now,
                         parse_chat_request, usage)
from .tokenizer import Tokenizer

log = logging.getLogger("qwen_serve.http")
MAX_BODY_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ServerInfo:
    model: str
    aliases: tuple[str, ...]
    backend: str
    quant: str
    block_size: int
    kv_blocks_total: int
    max_batch: int

    def serves(self, name: str) -> bool:
        return name == self.model or name in self.aliases


def json_response(body: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers,
                             dumps=lambda o: json.dumps(o, ensure_ascii=False))


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    """Turn every failure into an OpenAI error body; bad input is never a 500."""
    try:
        return await handler(request)
    except InvalidRequest as exc:
        return json_response(error_body(str(exc), param=exc.param), status=400)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = {404: f"no route {request.method} {request.path}", 405: f"method {request.method} not allowed on {request.path}",
                   413: f"request body exceeds {MAX_BODY_BYTES} bytes"}.get(exc.status, exc.reason)
        return json_response(error_body(message), status=exc.status, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response(error_body("internal server error", type_="server_error"), status=500)


class ChatServer:
    def __init__(self, engine: AsyncEngine, tokenizer: Tokenizer, info: ServerInfo) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.info = info
        self.metrics = ServerMetrics(engine)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/metrics/prometheus", self.metrics_prometheus)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    # --- simple endpoints ---------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        i = self.info
        return json_response({"status": "ok", "model": i.model, "backend": i.backend, "quant": i.quant,
                              "block_size": i.block_size, "kv_blocks_total": i.kv_blocks_total,
                              "max_batch": i.max_batch})

    async def models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [
            {"id": self.info.model, "object": "model", "created": 0, "owned_by": "qwen-serve"}]})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        if "text/plain" in accept and "application/json" not in accept:
            return await self.metrics_prometheus(request)
        return json_response(self.metrics.as_json())

    async def metrics_prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.prometheus_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- chat completions ---------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = parse_chat_request(await request.read())
        if req.model is not None and not self.info.serves(req.model):
            return json_response(error_body(f"model {req.model!r} is not served here (this server serves "
                                            f"{self.info.model!r})", param="model", code="model_not_found"),
                                 status=404)
        try:
            prompt = self.tokenizer.encode_chat(req.messages)
        except Exception as exc:  # the template rejected the conversation (e.g. role order)
            raise InvalidRequest(f"could not apply the chat template: {exc}", param="messages") from None
        request_id = new_completion_id()
        outputs = self.engine.generate(request_id, prompt, req.params, arrival)  # validates
        self.metrics.record_request()
        reply = _Reply(request_id, self.info.model, len(prompt), arrival)
        async with aclosing(outputs):
            if req.stream:
                return await self._stream(request, req, outputs, reply)
            return await self._complete(req, outputs, reply)

    async def _complete(self, req: ChatRequest, outputs, reply: "_Reply") -> web.Response:
        try:
            async for out in outputs:
                reply.add(out, self.tokenizer, req.top_logprobs)
        except EngineFailure as exc:
            return json_response(error_body(str(exc), type_="server_error"), status=500)
        if reply.finish_reason == "error":
            return json_response(error_body("internal error while generating", type_="server_error"), status=500)
        self._record(reply)
        return json_response(completion_response(
            reply.id, reply.model, reply.created, "".join(reply.texts), reply.finish_reason,
            reply.prompt_tokens, reply.completion_tokens, reply.logprobs if req.top_logprobs is not None else None))

    async def _stream(self, request: web.Request, req: ChatRequest, outputs, reply: "_Reply") -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(sse(chunk(reply.id, reply.model, reply.created, {"role": "assistant"})))
        try:
            async for out in outputs:
                logprobs = reply.add(out, self.tokenizer, req.top_logprobs)
                if out.new_text or logprobs:
                    await response.write(sse(chunk(reply.id, reply.model, reply.created, {"content": out.new_text},
                                                   logprobs=logprobs)))
                if out.finished and out.finish_reason == "error":
                    raise EngineFailure("internal error while generating")
                if out.finished:
                    await response.write(sse(chunk(reply.id, reply.model, reply.created, {}, out.finish_reason,
                                                   usage_block=usage(reply.prompt_tokens, reply.completion_tokens))))
        except EngineFailure as exc:
            await response.write(sse(error_body(str(exc), type_="server_error")))
        else:
            self._record(reply)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _record(self, reply: "_Reply") -> None:
        ttft = None if reply.first_token_at is None else reply.first_token_at - reply.arrival
        decode = 0.0 if reply.first_token_at is None else reply.last_token_at - reply.first_token_at
        self.metrics.record_latency(ttft, decode, reply.completion_tokens)


class _Reply:
    """What one request has produced so far."""

    def __init__(self, request_id: str, model: str, prompt_tokens: int, arrival: float) -> None:
        self.id = request_id
        self.model = model
        self.created = now()
        self.prompt_tokens = prompt_tokens
        self.arrival = arrival
        self.texts: list[str] = []
        self.completion_tokens = 0
        self.finish_reason = "stop"
        self.logprobs: list[dict[str, Any]] = []
        self.first_token_at: float | None = None
        self.last_token_at = 0.0

    def add(self, out, tokenizer: Tokenizer, top_logprobs: int | None) -> list[dict[str, Any]] | None:
        t = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = t
        self.last_token_at = t
        self.texts.append(out.new_text)
        self.completion_tokens += len(out.new_token_ids)
        if out.finished:
            self.finish_reason = out.finish_reason
        if top_logprobs is None:
            return None
        entries = [_logprob_entry(tokenizer, tok, lp or {}, top_logprobs)
                   for tok, lp in zip(out.new_token_ids, out.new_logprobs)]
        self.logprobs.extend(entries)
        return entries


def _token_info(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def _logprob_entry(tokenizer: Tokenizer, token_id: int, logprobs: dict[int, float], k: int) -> dict[str, Any]:
    entry = _token_info(tokenizer, token_id, logprobs.get(token_id, float("-inf")))
    top = sorted(logprobs.items(), key=lambda kv: -kv[1])[:k]
    entry["top_logprobs"] = [_token_info(tokenizer, t, lp) for t, lp in top]
    return entry
