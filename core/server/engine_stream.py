"""GET /engine/stream: the live engine view (qwen_serve.engine.view) as server-sent events.

One event a frame, at most every FRAME_INTERVAL_S and only when the view changed (an idle
engine costs a keep-alive comment now and then). The first frame carries the whole history of
the last minutes, later ones only its last seconds; the page merges them. Behind the Ray
ingress each replica's frames carry its id (``replica``) and the page shows one at a time. The engine takes views
only while a stream is open (AsyncEngine.watch), so nobody watching costs nothing, and at most
MAX_WATCHERS streams are served at once. A reader that stops reading is cut off after the
server's write deadline. Behind the same key as /metrics.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from aiohttp import web

from ..engine.client import ShowsEngineView, ViewUnavailable
from ..openai.streaming import KEEPALIVE, EventStream, sse
from .error_replies import error_reply

FRAME_INTERVAL_S = 0.25
KEEPALIVE_S = 5.0
RECENT_HISTORY_S = 3  # seconds of history each later frame carries
MAX_WATCHERS = 4


class EngineStream:
    def __init__(self, engine: Any, server_figures: Callable[[], dict[str, Any]], write_timeout_s: float) -> None:
        """server_figures: what the HTTP layer adds (requests refused, latency percentiles)."""
        self.engine = engine
        self.server_figures = server_figures
        self.write_timeout_s = write_timeout_s
        self.watchers = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not isinstance(self.engine, ShowsEngineView):
            return error_reply(request, 501, "this server's engine cannot show an engine view", type_="server_error")
        if self.watchers >= MAX_WATCHERS:
            return error_reply(request, 429, f"at most {MAX_WATCHERS} engine views are served at once",
                               code="too_many_watchers")
        try:
            watching = self.engine.watch()
        except ViewUnavailable as exc:
            return error_reply(request, 501, str(exc), type_="server_error")
        stream = EventStream(request, b"retry: 2000\n\n", 0, self.write_timeout_s)
        self.watchers += 1
        try:
            with watching:
                await self._frames(stream)
        finally:
            self.watchers -= 1
        return stream.response

    async def _frames(self, stream: EventStream) -> None:
        loop = asyncio.get_running_loop()
        seen: dict[str, Any] = {}  # engine -> the last view read
        last_sent: dict[str, dict] = {}  # engine -> the last frame sent, its clock and history left out
        quiet_since = loop.time()
        while True:
            for engine, view in self.engine.views().items():
                if view is seen.get(engine):
                    continue
                seen[engine] = view
                frame = view.as_json(None if engine not in last_sent else RECENT_HISTORY_S)
                frame["server"] = self.server_figures()
                if engine:
                    frame["replica"] = engine
                comparable = {**frame, "now": None, "history": None}
                if comparable != last_sent.get(engine):  # an idle engine's views repeat
                    await stream.send(sse(frame))
                    last_sent[engine], quiet_since = comparable, loop.time()
            if not stream.opened or loop.time() - quiet_since >= KEEPALIVE_S:
                await stream.send(KEEPALIVE)
                quiet_since = loop.time()
            await asyncio.sleep(FRAME_INTERVAL_S)
