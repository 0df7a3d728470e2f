"""Connections before they are requests. A stranger's idle or slow sockets must cost nothing that
other clients need, so each connection is counted (in total, and per client address for peers
that are not on this machine: a local reverse proxy speaks for many clients) and refused at once
past the caps, before aiohttp sees it; and every connection has a deadline for each request head,
from the moment it opens or its last response ended to the end of the next head, which also
closes idle keep-alive connections.

A connection is an asyncio protocol wrapping aiohttp's own: the wrapper counts and times, and
hands every event on unchanged.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .auth import is_loopback

REQUEST_TIMEOUT_S = 30.0  # for a request's head, its body, and each write to a client that stopped reading
MAX_CONNECTIONS = 1024  # open at once, in total
MAX_CONNECTIONS_PER_CLIENT = 64  # open at once from one address that is not this machine's


class ConnectionGuard:
    def __init__(self, max_total: int, max_per_address: int, head_timeout_s: float) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.head_timeout_s = head_timeout_s
        self.open_by_address: Counter[str] = Counter()
        self.refused_total = 0
        self.timed_out_total = 0  # closed for a request head that did not arrive in time
        self._by_transport: dict[asyncio.BaseTransport, GuardedConnection] = {}

    @property
    def open_total(self) -> int:
        return self.open_by_address.total()

    def protocol_factory(self, aiohttp_factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: GuardedConnection(aiohttp_factory(), self)

    def admits(self, address: str) -> bool:
        if self.open_total >= self.max_total:
            return False
        local = address == "" or is_loopback(address.split("%")[0])  # "": a Unix socket
        return local or self.open_by_address[address] < self.max_per_address

    def opened(self, connection: GuardedConnection) -> None:
        self.open_by_address[connection.address] += 1
        self._by_transport[connection.transport] = connection

    def closed(self, connection: GuardedConnection) -> None:
        self.open_by_address[connection.address] -= 1
        if not self.open_by_address[connection.address]:
            del self.open_by_address[connection.address]
        self._by_transport.pop(connection.transport, None)

    def middleware(self):
        """Stops a connection's head deadline while its request runs and restarts it after."""

        @web.middleware
        async def time_heads(request: web.Request, handler) -> web.StreamResponse:
            connection = self._by_transport.get(request.transport)
            if connection is None:
                return await handler(request)
            connection.head_arrived()
            try:
                return await handler(request)
            finally:
                connection.expect_head()

        return time_heads


class GuardedConnection(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.BaseTransport | None = None
        self.address = ""
        self.admitted = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) else ""
        if not self.guard.admits(self.address):
            self.guard.refused_total += 1
            transport.abort()
            return
        self.admitted = True
        self.guard.opened(self)
        self.inner.connection_made(transport)
        self.expect_head()

    def expect_head(self) -> None:
        self.head_arrived()
        self._deadline = asyncio.get_running_loop().call_later(self.guard.head_timeout_s, self._head_late)

    def head_arrived(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_late(self) -> None:
        self._deadline = None
        self.guard.timed_out_total += 1
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.head_arrived()
        self.guard.closed(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass through a ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner)
        self.host, self.port, self.guard = host, port, guard

    @property
    def name(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        factory = self.guard.protocol_factory(self._runner.server)
        self._server = await asyncio.get_running_loop().create_server(factory, self.host, self.port,
                                                                      reuse_address=True)


class ServerLog(logging.LoggerAdapter):
    """aiohttp's connection log, where a request its parser refuses (a client's mistake, already
    answered 400) is one line, not a traceback; any other failure keeps its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            reason = " ".join(str(exc_info.message).split())
            self.warning(f"{msg}: {exc_info.code} {reason}", *args, **kwargs)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)
