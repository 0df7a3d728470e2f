"""The aiohttp application: routes, the error middleware, and the small endpoints.

The OpenAI endpoints themselves live in qwen_serve.openai; this module only wires them to paths.
Every client mistake becomes a 4xx with an OpenAI error body before any SSE byte is sent.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from ..engine.client import EngineClient
from ..errors import InvalidRequest
from ..models.tokenizer import Tokenizer
from ..openai.chat import ChatCompletions
from ..openai.chat_format import ChatFormat
from ..openai.completions import Completions
from ..openai.responses import error_body, json_response
from ..openai.serving import ServedModel
from ..openai.tokenization import Tokenization
from .metrics import ServerMetrics

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
    def __init__(self, engine: EngineClient, tokenizer: Tokenizer, info: ServerInfo,
                 chat_format: ChatFormat | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.info = info
        self.metrics = ServerMetrics(engine)
        self.chat_format = chat_format or ChatFormat(tokenizer)

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
        served = ServedModel(self.engine, self.tokenizer, self.chat_format, self.info.model, self.info.serves,
                             self.metrics)
        tokenization = Tokenization(served)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/metrics/prometheus", self.metrics_prometheus)
        app.router.add_post("/v1/chat/completions", ChatCompletions(served).handle)
        app.router.add_post("/v1/completions", Completions(served).handle)
        app.router.add_post("/tokenize", tokenization.tokenize)
        app.router.add_post("/detokenize", tokenization.detokenize)
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
