"""One engine replica of the Ray Serve deployment: a qwen-serve engine (qwen_serve.engine.builder)
on its own thread behind AsyncEngine, streaming a request's outputs back to the ingress.

Each streamed item carries the replica's identity and its latest EngineSnapshot, which is how
the ingress keeps its cluster view; ``record_routing_stats`` gives the same figures to Ray's
controller, which passes them to every router of the deployment (the affinity router reads the
KV pool size from them). ``watch`` streams the engine view while the ingress's page watches
this replica (the routers send a ViewRequest to the replica it names). Closing the stream (the ingress cancels it when its client goes away)
aborts the request here, so its KV blocks return to this replica's pool at once.
"""
from __future__ import annotations

import asyncio
import os
import time
from contextlib import aclosing
from dataclasses import asdict
from typing import Any, AsyncGenerator

from ray import serve

from ..engine.async_engine import AsyncEngine
from ..engine.builder import build_engine
from .messages import EngineRequest, ReplicaOutput, ReplicaReport, ReplicaView, ViewRequest
from .spec import ModelSpec

VIEW_POLL_S = 0.25  # how often a watched replica looks for a new engine view


class EngineReplica:
    def __init__(self, spec: ModelSpec) -> None:
        self.engine: AsyncEngine | None = None  # __del__ runs even when building fails
        parts = build_engine(spec.model, spec.backend, spec.kv_cache, spec.dtype, spec.quant, **spec.engine_options)
        self.engine = AsyncEngine(parts.engine, arrival_window_s=spec.arrival_window_s)
        self.engine.start()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.pid = os.getpid()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[ReplicaOutput, None]:
        arrival = time.monotonic() - request.waited_s
        outputs = self.engine.generate(request.request_id, request.prompt, request.params, arrival, request.priority)
        async with aclosing(outputs):
            async for out in outputs:
                yield ReplicaOutput(out, self.report())

    async def watch(self, request: ViewRequest) -> AsyncGenerator[ReplicaView, None]:
        """This replica's engine view, each time it changes, for as long as the stream is open."""
        if request.replica != self.replica:
            raise ValueError(f"a view of replica {request.replica} was routed to {self.replica}")
        with self.engine.watch():
            sent = None
            while True:
                view = self.engine.view
                if view is not None and view is not sent:
                    yield ReplicaView(self.replica, view)
                    sent = view
                await asyncio.sleep(VIEW_POLL_S)

    def report(self) -> ReplicaReport:
        return ReplicaReport(self.replica, self.pid, self.engine.snapshot)

    def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Ray's controller every routing-stats period."""
        return {"replica": self.replica, "pid": self.pid, **asdict(self.engine.snapshot)}

    def __del__(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
