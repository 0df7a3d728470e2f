"""Server-Sent Events and request output streams.

An SSE body is ``data: <compact JSON>`` events (with an ``event:`` line where the API names
them), each followed by a blank line, ending with the API's end marker (OpenAI's
``data: [DONE]``). A client that goes away closes the output generators (under aclosing), which
aborts their requests so their KV blocks return to the pool at once.

The response opens only when there is something to send, which keeps the choice of status: a
request that fails before its first event (queue timeout, engine gone) still gets an HTTP error
status with a JSON body; after that it can only end with an error event. While a request waits or
prefills, ``: keep-alive`` comments go out (SSE clients, the openai client included, ignore
them), so proxies that cut idle connections (nginx: 60 s by default) do not cut a stream.
"""
from __future__ import annotations

import asyncio
import contextlib
from contextlib import aclosing
from typing import Any, AsyncGenerator, AsyncIterator, Sequence, TypeVar

from aiohttp import web

from .bodies import to_json

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
T = TypeVar("T")
_END = object()


def sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    """One event carrying compact JSON, named when the API names its events (Anthropic's and
    the Responses API's clients dispatch on the name)."""
    data = b"data: " + to_json(payload, separators=(",", ":")).encode() + b"\n\n"
    return data if event is None else f"event: {event}\n".encode() + data


async def merge_streams(streams: Sequence[AsyncIterator[Any]]) -> AsyncGenerator[tuple[int, Any], None]:
    """(which stream, item) as items arrive from several requests at once. An error in one
    stream is raised here; leaving early closes every stream (aborting its request)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    ended = object()

    async def pump(i: int, stream) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    await queue.put((i, item))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((i, exc))
        await queue.put((i, ended))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is ended:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _next(items: AsyncIterator[T]) -> T | object:
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return _END


class EventStream:
    def __init__(self, request: web.Request, first_event: bytes, keepalive_s: float,
                 write_timeout_s: float | None = None) -> None:
        """first_event opens the stream (the chunk with the assistant role); keepalive_s 0 sends
        none. A write that waits longer than write_timeout_s for the client to read (its socket
        buffers full) drops the connection: a reader that never reads would otherwise hold its
        request, and its admission slot, for ever."""
        self.request = request
        self.first_event = first_event
        self.keepalive_s = keepalive_s
        self.write_timeout_s = write_timeout_s
        self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    @property
    def opened(self) -> bool:
        return self.response.prepared

    async def send(self, event: bytes) -> None:
        if not self.opened:
            await self.response.prepare(self.request)
            await self._write(self.first_event)
        await self._write(event)

    async def _write(self, data: bytes) -> None:
        transport = self.request.transport
        if self.write_timeout_s is None or transport is None or not transport.get_write_buffer_size():
            await self.response.write(data)  # the client keeps up: nothing to wait for
            return
        try:
            await asyncio.wait_for(self.response.write(data), self.write_timeout_s)
        except asyncio.TimeoutError:
            transport.abort()
            raise ConnectionResetError(f"the client read nothing for {self.write_timeout_s:g} s") from None

    async def close(self) -> web.StreamResponse:
        """End the response (the API's own end marker was the last event sent)."""
        if not self.opened:  # nothing was sent at all
            await self.send(b"")
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
