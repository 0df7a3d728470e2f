"""The server process: open the port, load and warm up the model behind it, serve, drain.

The port opens first, so an orchestrator sees /health answer 503 "loading" instead of a refused
connection. The model loads on a separate thread; a short warm-up generation runs before the
engine thread starts and /health turns 200. SIGTERM or SIGINT starts a drain: /health and new
requests get 503 "draining", in-flight requests run to their end for up to --shutdown-timeout
seconds, what is still open then is aborted (streams end with an error event), and the
process exits 0. A second signal skips the wait.
"""
from __future__ import annotations

import asyncio
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from ..chat.format import ChatFormat
from ..engine.async_engine import ARRIVAL_WINDOW_S, AsyncEngine
from ..errors import QwenServeError
from ..sampling.params import SamplingParams
from .app import ChatServer, ServerInfo, ServerOptions
from .prometheus import RequestMetrics
from .request_log import RequestLog, request_logger

WARMUP_TEXT = "Hello"  # shorter than a block: the warm-up publishes nothing to the prefix cache
AFTER_ABORT_S = 5.0  # how long aborted handlers get to write their last bytes


@dataclass(frozen=True)
class ServeSettings:
    host: str
    port: int
    quant: str
    served_name: str | None
    model_arg: str | None
    options: ServerOptions
    queue_timeout_s: float | None = None
    shutdown_timeout_s: float = 30.0
    arrival_window_s: float = ARRIVAL_WINDOW_S
    log_requests: bool = False
    log_prompts: bool = False
    reasoning_parser: str | None = None  # None: chosen from the chat template
    tool_call_parser: str | None = None
    generation_config: str = "auto"  # auto: the checkpoint's sampling defaults for fields a request leaves out


def serve(load: Callable[[], Any], settings: ServeSettings) -> int:
    """load() builds the EngineParts (on a worker thread). Returns the exit code."""
    return asyncio.run(_serve(load, settings))


async def _serve(load: Callable[[], Any], s: ServeSettings) -> int:
    registry = CollectorRegistry(auto_describe=False)
    server = ChatServer(s.options, registry)
    runner = server.runner(server.make_app(), shutdown_timeout=AFTER_ABORT_S)
    await runner.setup()
    try:
        await server.site(runner, s.host, s.port).start()
    except OSError as exc:
        await runner.cleanup()
        raise QwenServeError(f"cannot listen on {s.host}:{s.port}: {exc.strerror or exc}") from None
    url = f"http://{'[' + s.host + ']' if ':' in s.host else s.host}:{s.port}"
    signals = _Signals()
    engine: AsyncEngine | None = None
    try:
        parts = await signals.unless_stopped(_in_thread(load))
        if parts is None:
            return 0  # stopped while loading
        name = s.served_name or parts.model_config.name
        request_metrics = RequestMetrics(registry, name)
        observers: list = [request_metrics]
        if s.log_requests:
            observers.append(RequestLog(request_logger(), parts.tokenizer.decode if s.log_prompts else None))
        engine = AsyncEngine(parts.engine, s.queue_timeout_s, observers, arrival_window_s=s.arrival_window_s)
        engine.start()
        aliases = tuple(a for a in (s.model_arg, parts.model_config.name) if a and a != name)
        server.attach(engine, parts.tokenizer, ServerInfo(
            model=name, aliases=aliases, backend=parts.backend.name, quant=s.quant,
            block_size=parts.engine_config.block_size, kv_blocks_total=parts.engine_config.kv_blocks,
            max_batch=parts.engine_config.max_batch, max_seq_len=parts.engine.max_seq_len,
            task=parts.engine_config.task), request_metrics,
            ChatFormat(parts.tokenizer, s.reasoning_parser, s.tool_call_parser),
            parts.model_config.sampling_defaults.served(s.generation_config))
        print(f"serving {name!r} on {url} (OpenAI API at {url}/v1)", file=sys.stderr, flush=True)
        await signals.stopped.wait()
        server.lifecycle.drain()
        in_flight = server.admission.in_flight
        print(f"draining: {in_flight} request(s) in flight, up to {s.shutdown_timeout_s:g} s", file=sys.stderr, flush=True)
        if not await signals.unless_stopped(server.admission.wait_idle(s.shutdown_timeout_s)):
            print(f"aborting {server.admission.in_flight} unfinished request(s)", file=sys.stderr, flush=True)
            engine.abort_all("the server shut down before this request finished")
            await server.admission.wait_idle(AFTER_ABORT_S)
        return 0
    finally:
        await runner.cleanup()
        if engine is not None:
            engine.shutdown()


def warm_up(parts: Any) -> None:
    """One short greedy generation through the whole engine (prefill and a decode step; a
    prefill alone for a pooling task), so the first real request does not pay for lazy
    initialisation. Seeded, so a backend whose
    sampler follows the seed (the tests' scripted one) sees a fixed request."""
    prompt = parts.tokenizer.encode(WARMUP_TEXT)[: parts.engine_config.block_size - 2]
    if parts.engine_config.task != "generate":  # an embedding or reranking engine only prefills
        parts.engine.run_pooling([("warm-up", prompt)])
        return
    parts.engine.run([("warm-up", prompt, SamplingParams(max_tokens=2, temperature=0.0, seed=0))])


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """fn() on a daemon thread (a model load cannot be cancelled; a signal must not wait for it)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(outcome: Callable[[], Any]) -> None:
        try:
            loop.call_soon_threadsafe(lambda: future.done() or outcome())
        except RuntimeError:  # the event loop has closed: the server stopped while this ran
            pass

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the event loop, raised there
            settle(lambda error=exc: future.set_exception(error))
        else:
            settle(lambda: future.set_result(result))

    threading.Thread(target=run, name="qwen-serve-load", daemon=True).start()
    return await future


class _Signals:
    """SIGTERM and SIGINT: the first one stops serving, a second one skips the drain's wait."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()
        self.hurry = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)

    def _on_signal(self) -> None:
        (self.hurry if self.stopped.is_set() else self.stopped).set()

    async def unless_stopped(self, awaitable) -> Any:
        """The awaitable's result, or None if a signal (the first while loading, the second
        while draining) came first."""
        task = asyncio.ensure_future(awaitable)
        interrupt = asyncio.ensure_future((self.hurry if self.stopped.is_set() else self.stopped).wait())
        await asyncio.wait({task, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        interrupt.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None
