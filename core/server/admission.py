"""Bounded admission: at most max_batch running + max_queue waiting generation requests in
flight; past that a request is refused at once with 429 and a Retry-After estimate, so a
gateway hears "busy" instead of queueing forever. The count also tells a drain when the last
in-flight request has finished."""
from __future__ import annotations

import asyncio
import math
from typing import Callable

from aiohttp import web

from .error_replies import error_reply

MAX_RETRY_AFTER_S = 60


class Admission:
    def __init__(self, max_batch: int, max_queue: int, mean_latency_s: Callable[[], float | None],
                 on_reject: Callable[[], None]) -> None:
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.limit = max_batch + max_queue
        self.in_flight = 0
        self._mean_latency_s = mean_latency_s
        self._on_reject = on_reject
        self._idle = asyncio.Event()
        self._idle.set()

    def retry_after_s(self) -> int:
        """Seconds until a batch slot is likely to free: the mean request latency over the batch."""
        latency = self._mean_latency_s()
        if latency is None:
            return 1
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(latency / self.max_batch)))

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Whether every in-flight request finished within timeout_s."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def middleware(self, is_generation: Callable[[web.Request], bool]):
        @web.middleware
        async def admit(request: web.Request, handler) -> web.StreamResponse:
            if not is_generation(request):
                return await handler(request)
            if not self.try_enter():
                self._on_reject()
                return error_reply(request, 429, f"the server is at capacity ({self.max_batch} running + "
                                   f"{self.max_queue} waiting requests); retry later", type_="rate_limit_error",
                                   code="queue_full", headers={"Retry-After": str(self.retry_after_s())})
            try:
                return await handler(request)
            finally:
                self.leave()

        return admit
