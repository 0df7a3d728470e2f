"""POST /v1/chat/completions: render the conversation, run it, answer as JSON or as SSE.

A client that goes away (mid-stream or while waiting) closes the output generator, which aborts
the request, so its KV blocks return to the pool at once.
"""
from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any, Callable

from aiohttp import web

from ..engine.async_engine import AsyncEngine, EngineFailure
from ..errors import InvalidRequest
from ..models.tokenizer import Tokenizer
from .protocol import ChatRequest, parse_chat_request
from .responses import chunk, completion_response, error_body, json_response, new_completion_id, now, sse, usage
from .streaming import EventStream


class ChatCompletions:
    def __init__(self, engine: AsyncEngine, tokenizer: Tokenizer, model: str, serves: Callable[[str], bool],
                 metrics: Any, keepalive_s: float = 5.0) -> None:
        self.engine = engine
        self.keepalive_s = keepalive_s
        self.tokenizer = tokenizer
        self.model = model
        self.serves = serves
        self.metrics = metrics

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req = parse_chat_request(await request.read())
        if req.model is not None and not self.serves(req.model):
            return json_response(error_body(f"model {req.model!r} is not served here (this server serves "
                                            f"{self.model!r})", param="model", code="model_not_found"),
                                 status=404)
        try:
            prompt = self.tokenizer.encode_chat(req.messages)
        except Exception as exc:  # the template rejected the conversation (e.g. role order)
            raise InvalidRequest(f"could not apply the chat template: {exc}", param="messages") from None
        request_id = new_completion_id()
        outputs = self.engine.generate(request_id, prompt, req.params, arrival, priority=req.priority)  # validates
        self.metrics.record_request()
        reply = _Reply(request_id, self.model, len(prompt), arrival)
        async with aclosing(outputs):
            if req.stream:
                return await self._stream(request, req, outputs, reply)
            return await self._complete(req, outputs, reply)

    async def _complete(self, req: ChatRequest, outputs, reply: "_Reply") -> web.Response:
        async for out in outputs:  # an EngineFailure becomes its HTTP status in the error middleware
            reply.add(out, self.tokenizer, req.top_logprobs)
        if reply.finish_reason == "error":
            return json_response(error_body("internal error while generating", type_="server_error"), status=500)
        self._record(reply)
        return json_response(completion_response(
            reply.id, reply.model, reply.created, "".join(reply.texts), reply.finish_reason,
            reply.prompt_tokens, reply.completion_tokens, reply.logprobs if req.top_logprobs is not None else None))

    async def _stream(self, request: web.Request, req: ChatRequest, outputs, reply: "_Reply") -> web.StreamResponse:
        stream = EventStream(request, sse(chunk(reply.id, reply.model, reply.created, {"role": "assistant"})),
                             self.keepalive_s)
        try:
            async with aclosing(stream.relay(outputs)) as events:
                async for out in events:
                    logprobs = reply.add(out, self.tokenizer, req.top_logprobs)
                    if out.new_text or logprobs:
                        await stream.send(sse(chunk(reply.id, reply.model, reply.created, {"content": out.new_text},
                                                    logprobs=logprobs)))
                    if out.finished and out.finish_reason == "error":
                        raise EngineFailure("internal error while generating")
                    if out.finished:
                        await stream.send(sse(chunk(reply.id, reply.model, reply.created, {}, out.finish_reason,
                                                    usage_block=usage(reply.prompt_tokens, reply.completion_tokens))))
        except EngineFailure as exc:
            if not stream.opened:
                raise  # nothing sent yet: the error middleware answers with a status
            await stream.send(sse(error_body(str(exc), type_="server_error")))
        else:
            self._record(reply)
        return await stream.close()

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
