"""The aiohttp application: routes, the gates in front of them, and the small endpoints.

The API endpoints themselves live in qwen_serve.openai (its pooling routes too),
qwen_serve.anthropic and qwen_serve.responses; this module only wires them to paths (and holds the server's store of
Responses API responses).
Connections pass a guard first (connections.py: caps on open connections, a deadline for each
request head). Every request then passes, outermost first: the error middleware (every client
mistake becomes a 4xx in its API's error shape before any SSE byte is sent), API keys (401),
the lifecycle gate (503 while loading, draining or dead), the body read under its deadline (408)
and bounded admission (429), so only a request whose body has arrived holds a slot. The port
opens before the model has loaded: ``attach`` hands over the engine once it has warmed up.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from ..anthropic.messages import Messages
from ..chat.format import ChatFormat
from ..checkpoints.tokenizer import Tokenizer
from ..engine.client import EngineClient
from ..engine.failures import EngineDead, EngineFailure, EngineUnavailable, QueueTimeout, ShuttingDown
from ..errors import InvalidRequest
from ..openai.bodies import json_response
from ..openai.chat import ChatCompletions
from ..openai.completions import Completions
from ..openai.pooling import Pooling
from ..openai.serving import ServedModel
from ..openai.tokenization import Tokenization
from ..responses.handler import Responses
from ..responses.store import ResponseStore
from ..sampling.defaults import SamplingDefaults
from .admission import Admission
from .auth import ApiKeys, require_api_key
from .body import read_body_first
from .connections import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    REQUEST_TIMEOUT_S,
    ConnectionGuard,
    GuardedSite,
    ServerLog,
)
from .engine_stream import EngineStream
from .error_replies import error_reply
from .lifecycle import Lifecycle, lifecycle_gate
from .metrics import ServerMetrics
from .openapi import openapi_document
from .page import ASSET_PREFIX, Page, wants_page
from .prometheus import ConnectionGauges, EngineGauges, RequestMetrics

log = logging.getLogger("qwen_serve.http")
MAX_BODY_BYTES = 4 * 2**20
# aiohttp reads and discards an unanswered body for 10 s by default, so a client sending it sees
# the answer rather than a reset; a stranger refused with a 401 should cost no more than a moment.
UNREAD_BODY_LINGER_S = 2.0
METRICS_PATHS = ("/metrics", "/metrics/prometheus", "/engine/stream")
ALWAYS_OPEN = ("/", "/engine", "/health", "/openapi.json")  # and the page's files under ASSET_PREFIX
FAILURE_CODES = {EngineDead: "engine_dead", QueueTimeout: "queue_timeout", ShuttingDown: "shutting_down"}


@dataclass(frozen=True)
class ServerInfo:
    model: str
    aliases: tuple[str, ...]
    backend: str
    quant: str
    block_size: int
    kv_blocks_total: int
    max_batch: int
    max_seq_len: int | None = None  # prompt + generated tokens, at most
    task: str = "generate"  # or embed / rerank (--task)

    def serves(self, name: str) -> bool:
        return name == self.model or name in self.aliases


@dataclass(frozen=True)
class ServerOptions:
    """How the HTTP layer guards the engine (the serving flags of the command line)."""

    max_batch: int = 8
    max_queue: int = 64
    api_keys: ApiKeys = ApiKeys(())
    metrics_public: bool = False
    keepalive_s: float = 5.0
    request_timeout_s: float = REQUEST_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    responses_store_mb: float = 64.0  # stored Responses API responses, in MiB at most; 0: none
    reasoning_budget: int | None = None  # tokens a think block may take unless a request says; None: no cap


@dataclass(frozen=True)
class Paths:
    """Paths named exactly, and every path under the prefixes (``path in paths``)."""

    exact: tuple[str, ...]
    prefixes: tuple[str, ...] = ()

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and (path in self.exact or path.startswith(self.prefixes))


def is_generation(request: web.Request) -> bool:
    """The requests admission counts: every POST under /v1/."""
    return request.method == "POST" and request.path.startswith("/v1/")


class ChatServer:
    def __init__(self, options: ServerOptions, registry: CollectorRegistry) -> None:
        self.options = options
        self.registry = registry
        self.lifecycle = Lifecycle()
        # Admission runs only once the lifecycle gate lets requests through, i.e. after attach().
        self.admission = Admission(options.max_batch, options.max_queue, lambda: self.request_metrics.mean_e2e_s,
                                   lambda: self.request_metrics.rejected("queue_full"))
        self.connections = ConnectionGuard(options.max_connections, options.max_connections_per_client,
                                           options.request_timeout_s)
        registry.register(ConnectionGauges(self.connections))
        self.engine: EngineClient | None = None
        self.info: ServerInfo | None = None
        self.request_metrics: RequestMetrics | None = None
        self.metrics: ServerMetrics | None = None
        self.served: ServedModel | None = None
        self.responses_store = ResponseStore(int(options.responses_store_mb * 2**20))
        self.page = Page()
        self.engine_stream: EngineStream | None = None

    def attach(self, engine: EngineClient, tokenizer: Tokenizer, info: ServerInfo, request_metrics: RequestMetrics,
               chat_format: ChatFormat | None = None, sampling_defaults: SamplingDefaults = SamplingDefaults()) -> None:
        """The engine has loaded, warmed up and started (request_metrics among its observers): serve."""
        self.engine, self.info, self.request_metrics = engine, info, request_metrics
        self.metrics = ServerMetrics(engine, self.registry)
        self.registry.register(EngineGauges(engine, info.model))
        self.served = ServedModel(engine, tokenizer, chat_format or ChatFormat(tokenizer), info.model, info.serves,
                                  self.metrics, keepalive_s=self.options.keepalive_s,
                                  write_timeout_s=self.options.request_timeout_s, sampling_defaults=sampling_defaults,
                                  reasoning_budget=self.options.reasoning_budget)
        self.engine_stream = EngineStream(engine, self._server_figures, self.options.request_timeout_s)
        self.lifecycle.ready(engine)

    def make_app(self) -> web.Application:
        always_open = Paths(ALWAYS_OPEN, (ASSET_PREFIX,))
        open_paths = Paths(ALWAYS_OPEN + (METRICS_PATHS if self.options.metrics_public else ()), (ASSET_PREFIX,))
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[
            self.connections.middleware(),
            self.api_errors,
            require_api_key(self.options.api_keys, open_paths),
            lifecycle_gate(self.lifecycle, always_open, METRICS_PATHS),
            read_body_first(self.options.request_timeout_s),
            self.admission.middleware(is_generation),
        ])
        app.router.add_get("/", self.root)  # and HEAD, which Claude Code sends first
        app.router.add_get("/health", self.health)
        app.router.add_get("/openapi.json", self.openapi)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/metrics/prometheus", self.metrics_prometheus)
        app.router.add_get("/engine/stream", self.engine_view)
        self.page.add_routes(app)
        app.router.add_post("/v1/chat/completions", self._handler(lambda served: ChatCompletions(served).handle))
        app.router.add_post("/v1/completions", self._handler(lambda served: Completions(served).handle))
        app.router.add_post("/v1/messages", self._handler(lambda served: Messages(served).create))
        app.router.add_post("/v1/messages/count_tokens", self._handler(lambda served: Messages(served).count_tokens))
        app.router.add_post("/v1/responses", self._handler(lambda served: self._responses(served).create))
        app.router.add_get("/v1/responses/{response_id}",
                           self._handler(lambda served: self._responses(served).retrieve))
        app.router.add_delete("/v1/responses/{response_id}",
                              self._handler(lambda served: self._responses(served).delete))
        app.router.add_post("/v1/embeddings", self._handler(lambda served: Pooling(served).embeddings))
        app.router.add_post("/v1/rerank", self._handler(lambda served: Pooling(served).rerank))
        app.router.add_post("/v1/score", self._handler(lambda served: Pooling(served).score))
        app.router.add_post("/tokenize", self._handler(lambda served: Tokenization(served).tokenize))
        app.router.add_post("/detokenize", self._handler(lambda served: Tokenization(served).detokenize))
        return app

    def runner(self, app: web.Application, **options) -> web.AppRunner:
        """The runner of ``app`` (make_app's, perhaps with more routes): handlers are cancelled
        when their client goes, no access log, malformed requests logged in one line, and a body
        left unread (a 401, 408 or 413 answered before it arrived) drained for at most
        UNREAD_BODY_LINGER_S so the client can read the answer: then the connection closes."""
        return web.AppRunner(app, handler_cancellation=True, access_log=None, logger=ServerLog(),
                             lingering_time=min(UNREAD_BODY_LINGER_S, self.options.request_timeout_s), **options)

    def site(self, runner: web.BaseRunner, host: str, port: int) -> GuardedSite:
        """Where the app listens, its connections under this server's guard."""
        return GuardedSite(runner, host, port, self.connections)

    @web.middleware
    async def api_errors(self, request: web.Request, handler) -> web.StreamResponse:
        """Turn every failure into an error body in the shape of the route's API; bad input is
        never a 500."""
        try:
            return await handler(request)
        except InvalidRequest as exc:
            return error_reply(request, 400, str(exc), param=exc.param)
        except EngineFailure as exc:  # before any SSE byte: the status can still say it
            unavailable = isinstance(exc, EngineUnavailable)
            headers = {"Retry-After": str(self.admission.retry_after_s())} if isinstance(exc, QueueTimeout) else None
            return error_reply(request, 503 if unavailable else 500, str(exc), type_="server_error",
                               code=FAILURE_CODES.get(type(exc)), headers=headers)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            message = {404: f"no route {request.method} {request.path}",
                       405: f"method {request.method} not allowed on {request.path}",
                       408: f"the request body did not arrive within {self.options.request_timeout_s:g} s",
                       413: f"request body exceeds {MAX_BODY_BYTES} bytes"}.get(exc.status, exc.reason)
            response = error_reply(request, exc.status, message, headers=headers)
            if exc.status in (408, 413):  # the rest of the body may still come: it is no next request
                response.force_close()
            return response
        except ConnectionResetError:  # the client left mid-reply: its request was aborted, nothing to say
            return web.Response(status=499)  # never sent; what the access log would call it (nginx)
        except asyncio.CancelledError:
            raise
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("unhandled error %s in %s %s", error_id, request.method, request.path)
            return error_reply(request, 500, f"internal server error (id {error_id})", type_="server_error")

    # --- endpoints ----------------------------------------------------------------------
    def _handler(self, make: Callable[[ServedModel], Callable[[web.Request], Awaitable[web.StreamResponse]]]):
        """A route to an OpenAI handler over the attached model (the lifecycle gate keeps
        requests out until attach(); the handlers only hold the ServedModel, so each request
        makes its own)."""

        async def handle(request: web.Request) -> web.StreamResponse:
            return await make(self.served)(request)

        return handle

    def _responses(self, served: ServedModel) -> Responses:
        return Responses(served, self.responses_store)

    async def root(self, request: web.Request) -> web.Response:
        if wants_page(request):
            return await self.page.index(request)
        return json_response({"name": "qwen-serve", "openapi": "/openapi.json", "health": "/health"})

    async def health(self, request: web.Request) -> web.Response:
        status = self.lifecycle.status
        body: dict = {"status": status}
        if self.info is not None:
            i = self.info
            body.update(model=i.model, task=i.task, backend=i.backend, quant=i.quant, block_size=i.block_size,
                        kv_blocks_total=i.kv_blocks_total, max_batch=i.max_batch)
        return json_response(body, status=200 if status == "ok" else 503)

    async def openapi(self, request: web.Request) -> web.Response:
        info = self.info
        served = self.served
        return json_response(openapi_document(info.model if info else None, bool(self.options.api_keys),
                                              self.options.metrics_public, info.max_seq_len if info else None,
                                              served.vocab_size if served else None))

    async def models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [
            {"id": self.info.model, "object": "model", "created": 0, "owned_by": "qwen-serve"}]})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        if "text/plain" in accept and "application/json" not in accept:
            return await self.metrics_prometheus(request)
        return json_response(self.metrics.as_json())

    async def engine_view(self, request: web.Request) -> web.StreamResponse:
        return await self.engine_stream.handle(request)

    def _server_figures(self) -> dict:
        """What the engine view shows beside the engine's own figures."""
        metrics = self.metrics.as_json()
        return {"requests_total": metrics["requests_total"], "ttft_ms": metrics["ttft_ms"], "tpot_ms": metrics["tpot_ms"],
                "rejected": dict(self.request_metrics.rejections), "model": self.info.model}

    async def metrics_prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.prometheus_text(), headers={"Content-Type": CONTENT_TYPE_LATEST})
