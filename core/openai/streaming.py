"""Server-Sent Events and request output streams.

An SSE body is ``data: <compact JSON>`` events, each followed by a blank line, ending with
``data: [DONE]``. A client that goes away closes the output generators (under aclosing), which
aborts their requests so their KV blocks return to the pool at once.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any, AsyncGenerator, AsyncIterator, Sequence

from aiohttp import web

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One event carrying compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def close_event_stream(response: web.StreamResponse) -> None:
    await response.write(DONE)
    await response.write_eof()


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
