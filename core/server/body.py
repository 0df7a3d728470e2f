"""A POST's body is read before anything counts the request, under a deadline: a client that
sends headers and then trickles (or never sends) its body holds a socket until the deadline
and then gets 408, never an admission slot that other clients need. The handlers read the
same bytes again from aiohttp's cache."""
from __future__ import annotations

import asyncio

from aiohttp import web


def read_body_first(timeout_s: float):
    @web.middleware
    async def read_body(request: web.Request, handler) -> web.StreamResponse:
        if request.method == "POST":
            try:
                await asyncio.wait_for(request.read(), timeout_s)
            except asyncio.TimeoutError:
                raise web.HTTPRequestTimeout() from None
        return await handler(request)

    return read_body
