"""Server-Sent Events for the streaming handlers: a response opened only when there is
something to send, and `: keep-alive` comments while a request waits or prefills.

Opening late keeps the choice of status: a request that fails before its first event (queue
timeout, engine gone) still gets an HTTP error status with a JSON body; after that it can only
end with an error event. Comment lines are ignored by SSE clients (the openai client included),
and they keep proxies that cut idle connections (nginx: 60 s by default) from cutting a stream.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, TypeVar

from aiohttp import web

T = TypeVar("T")
KEEPALIVE = b": keep-alive\n\n"
_END = object()


async def _next(items: AsyncIterator[T]) -> T | object:
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return _END


class EventStream:
    def __init__(self, request: web.Request, first_event: bytes, keepalive_s: float) -> None:
        """first_event opens the stream (the chunk with the assistant role); keepalive_s 0 sends none."""
        self.request = request
        self.first_event = first_event
        self.keepalive_s = keepalive_s
        self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    @property
    def opened(self) -> bool:
        return self.response.prepared

    async def send(self, event: bytes) -> None:
        if not self.opened:
            await self.response.prepare(self.request)
            await self.response.write(self.first_event)
        await self.response.write(event)

    async def close(self) -> web.StreamResponse:
        await self.send(b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response

    async def relay(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """items, sending a keep-alive comment whenever keepalive_s pass without one. The wait
        on items is never cancelled by a keep-alive (only when the client goes away)."""
        if not self.keepalive_s:
            async for item in items:
                yield item
            return
        pending: asyncio.Task | None = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(_next(items))
                done, _ = await asyncio.wait({pending}, timeout=self.keepalive_s)
                if not done:
                    await self.send(KEEPALIVE)
                    continue
                item, pending = pending.result(), None
                if item is _END:
                    return
                yield item
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
