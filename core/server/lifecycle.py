"""Where the server is in its life, as /health reports it, and the gate that follows from it.

loading (the port is open, the model is loading and warming up) -> ok -> draining (after
SIGTERM/SIGINT: in-flight requests finish, new ones are refused); "dead" whenever the engine
thread has died. Only "ok" serves requests; /health and the OpenAPI document always answer,
/metrics once an engine exists.
"""
from __future__ import annotations

from typing import Container

from aiohttp import web

from ..engine.client import EngineClient
from .error_replies import error_reply

LOADING_RETRY_AFTER_S = 5
MESSAGES = {
    "loading": "the model is still loading; retry shortly",
    "draining": "the server is shutting down and accepts no new requests",
    "dead": "the engine has stopped; the server must be restarted",
}


class Lifecycle:
    def __init__(self) -> None:
        self.engine: EngineClient | None = None
        self.draining = False

    def ready(self, engine: EngineClient) -> None:
        """The engine has loaded, warmed up and started."""
        self.engine = engine

    def drain(self) -> None:
        self.draining = True

    @property
    def status(self) -> str:
        if self.engine is None:
            return "loading"
        if not self.engine.is_alive():
            return "dead"
        return "draining" if self.draining else "ok"


def unavailable(request: web.Request, status: str, detail: str | None = None) -> web.Response:
    message = MESSAGES[status] + (f" ({detail})" if detail else "")
    headers = {"Retry-After": str(LOADING_RETRY_AFTER_S)} if status == "loading" else None
    return error_reply(request, 503, message, type_="server_error", code=status, headers=headers)


def lifecycle_gate(lifecycle: Lifecycle, always_open: Container[str], open_once_loaded: Container[str]):
    """Middleware: 503 with the status as error code unless the server is "ok" or the path
    answers in every state."""

    @web.middleware
    async def gate(request: web.Request, handler) -> web.StreamResponse:
        status = lifecycle.status
        if status == "ok" or request.path in always_open or (status != "loading" and request.path in open_once_loaded):
            return await handler(request)
        engine = lifecycle.engine
        return unavailable(request, status, engine.dead_reason if status == "dead" and engine is not None else None)

    return gate
