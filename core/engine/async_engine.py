"""Runs the engine loop on its own thread so a long prefill never blocks the event loop.

The event loop only validates requests and queues commands; the engine thread owns every
engine object, applies commands between steps, and hands outputs back through
``loop.call_soon_threadsafe``. A request is an async iterator of RequestOutput.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncGenerator, Callable, Sequence

from .engine import Engine, RequestOutput
from .sampling_params import SamplingParams
from .stats import EngineSnapshot, ThroughputWindow

log = logging.getLogger("qwen_serve.engine")


class EngineFailure(Exception):
    """The engine raised while running this request (a server bug, not bad input)."""


@dataclass
class _Add:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_time: float
    deliver: Callable[[RequestOutput | Exception], None]


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sinks: dict[str, Callable[[RequestOutput | Exception], None]] = {}
        self._unfinished_choices: dict[str, int] = {}
        self.throughput = ThroughputWindow(seconds=10.0)
        self.snapshot = EngineSnapshot.take(engine, self.throughput)
        self._thread = threading.Thread(target=self._run, name="qwen-serve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    # --- event-loop side ----------------------------------------------------------------
    def generate(self, request_id: str, prompt: Sequence[int], params: SamplingParams,
                 arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        """Validates now (raises InvalidRequest before anything is queued or sent), then returns
        the request's outputs: with n > 1 the choices' outputs interleave (RequestOutput.index),
        and the iterator ends when every choice has finished. Closing the generator early (client gone) aborts the request:
        use it under contextlib.aclosing so that happens at once."""
        checked = self.engine.check_request(prompt, params)
        return self._stream(request_id, checked, params, arrival_time)

    async def _stream(self, request_id: str, prompt: list[int], params: SamplingParams,
                      arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()

        def deliver(item: RequestOutput | Exception) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        self._send(_Add(request_id, prompt, params, arrival_time, deliver))
        finished = False
        unfinished_choices = params.n
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                if item.finished:
                    unfinished_choices -= 1
                finished = unfinished_choices == 0
                yield item
        finally:
            if not finished:
                self._send(_Abort(request_id))

    def _send(self, command: _Add | _Abort) -> None:
        self._commands.put(command)
        self._wake.set()

    # --- engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._apply_commands()
            if not self.engine.has_unfinished():
                self.snapshot = EngineSnapshot.take(self.engine, self.throughput)
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug: fail what is running, keep serving
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            self.throughput.add(time.monotonic(), len(outputs))
            self.snapshot = EngineSnapshot.take(self.engine, self.throughput)  # before replies go out
            for out in outputs:
                sink = self._sinks.get(out.request_id)
                if sink is not None:
                    sink(out)
                if out.finished and out.request_id in self._unfinished_choices:
                    self._unfinished_choices[out.request_id] -= 1
                    if self._unfinished_choices[out.request_id] == 0:
                        del self._unfinished_choices[out.request_id]
                        self._sinks.pop(out.request_id, None)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Abort):
                self._sinks.pop(command.request_id, None)
                self._unfinished_choices.pop(command.request_id, None)
                self.engine.abort(command.request_id)
                continue
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params, command.arrival_time)
            except Exception as exc:
                command.deliver(exc)
                continue
            self._sinks[command.request_id] = command.deliver
            self._unfinished_choices[command.request_id] = command.params.n

    def _fail_all(self, exc: Exception) -> None:
        for request_id, sink in list(self._sinks.items()):
            self.engine.abort(request_id)
            sink(EngineFailure(f"internal error while generating: {type(exc).__name__}"))
        self._sinks.clear()
        self._unfinished_choices.clear()
