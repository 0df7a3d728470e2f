"""Runs the engine loop on its own thread so a long prefill never blocks the event loop.

The event loop only validates requests and queues commands; the engine thread owns every
engine object, applies commands between steps, and hands outputs back through
``loop.call_soon_threadsafe``. A request is an async iterator of RequestOutput.

A request that cannot finish ends with an exception from that iterator, never by hanging:
EngineFailure when a step raised (the others go on), QueueTimeout when it waited longer than
``queue_timeout_s`` without being scheduled, ShuttingDown when the server aborted it on the way
out, EngineDead once the engine thread has died (a FatalEngineError from a plugin, or any error
outside a step): then every open request fails and new ones are refused.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import AsyncGenerator, Callable, Iterator, Sequence

from ..errors import FatalEngineError
from ..heap import return_free_heap
from ..sampling.params import SamplingParams
from .engine import POOLING, Engine
from .failures import EngineDead, EngineFailure, QueueTimeout, ShuttingDown
from .outputs import RequestOutput
from .sequence import Sequence as EngineSequence
from .stats import EngineSnapshot, RequestObserver, RequestRecord, ThroughputWindow
from .view import EngineView, EngineWatch

log = logging.getLogger("qwen_serve.engine")
IDLE_TRIM_S = 1.0  # idle this long after work, the engine thread returns the freed heap to the OS
ARRIVAL_WINDOW_S = 0.02  # the longest a new request waits for the next one of a burst (default)
ARRIVAL_SHARE = 0.05  # of the gathered prompts' estimated prefill time: the wait for one more arrival
MEASURED_PREFILL_ROWS = 32  # steps with at least this many prefill rows time a prefill row


@dataclass
class _Add:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int
    deliver: Callable[[RequestOutput | Exception], None]
    pooling: bool = False  # an input to embed or score (Engine.add_pooling)


@dataclass
class _Abort:
    request_id: str


@dataclass
class _AbortAll:
    reason: str


@dataclass
class _Tracked:
    """A request the engine thread is running for the event loop."""

    seq: EngineSequence  # the first choice (its timings stand for the request's)
    deliver: Callable[[RequestOutput | Exception], None]
    unfinished_choices: int = 1  # SamplingParams.n until choices finish
    last_output_time: float | None = None


class AsyncEngine:
    def __init__(self, engine: Engine, queue_timeout_s: float | None = None,
                 observers: Sequence[RequestObserver] = (), trim_heap: Callable[[], object] = return_free_heap,
                 arrival_window_s: float = ARRIVAL_WINDOW_S) -> None:
        self.engine = engine
        self.arrival_window_s = arrival_window_s  # see _gather_arrivals; 0: step at once
        self.prefill_row_s: float | None = None  # seconds per prefill row, from the last long prefill step
        self.trim_heap = trim_heap  # run on the engine thread once it idles after work (heap.py)
        self.queue_timeout_s = queue_timeout_s
        self.observers = tuple(observers)
        self.dead_reason: str | None = None  # set once, by the dying engine thread
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "dead" against queueing a new request
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._requests: dict[str, _Tracked] = {}  # engine thread only
        self.throughput = ThroughputWindow(seconds=10.0)
        self.snapshot = EngineSnapshot.take(engine, self.throughput)
        self.watched = EngineWatch()
        self._thread = threading.Thread(target=self._run, name="qwen-serve-engine", daemon=True)
        self._stepped_since_trim = False

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return self.dead_reason is None and self._thread.is_alive()

    # --- event-loop side ----------------------------------------------------------------
    def generate(self, request_id: str, prompt: Sequence[int], params: SamplingParams,
                 arrival_time: float, priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Validates now (raises InvalidRequest before anything is queued or sent), then returns
        the request's outputs: with n > 1 the choices' outputs interleave (RequestOutput.index),
        and the iterator ends when every choice has finished. Closing the generator early (client gone) aborts the request:
        use it under contextlib.aclosing so that happens at once."""
        checked = self.engine.check_request(prompt, params)
        self.engine.check_priority(priority)
        return self._stream(request_id, checked, params, arrival_time, priority)

    def pool(self, request_id: str, prompt: Sequence[int], arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        """``generate`` for an input to embed or score: one output, its ``pooled`` row."""
        checked = self.engine.check_pooling(prompt)
        return self._stream(request_id, checked, POOLING, arrival_time, 0, pooling=True)

    @property
    def view(self) -> EngineView | None:
        """The latest engine view, while watched."""
        return self.watched.view

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """While open, the engine thread keeps ``view`` fresh; with nobody watching it takes none."""
        with self.watched.opened():
            self._wake.set()  # an idle engine takes one now
            yield

    def views(self) -> dict[str, EngineView]:
        view = self.view
        return {} if view is None else {"": view}

    def abort_all(self, reason: str) -> None:
        """End every open request with ShuttingDown(reason) (the end of a drain)."""
        self._send(_AbortAll(reason))

    async def _stream(self, request_id: str, prompt: list[int], params: SamplingParams, arrival_time: float,
                      priority: int, pooling: bool = False) -> AsyncGenerator[RequestOutput, None]:
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()

        def deliver(item: RequestOutput | Exception) -> None:
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, item)
            except RuntimeError:  # the event loop has closed: nobody waits for this any more
                pass

        self._send(_Add(request_id, prompt, params, arrival_time, priority, deliver, pooling))
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

    def _send(self, command: _Add | _Abort | _AbortAll) -> None:
        with self._lock:
            if self.dead_reason is not None:
                if isinstance(command, _Add):
                    raise EngineDead(f"the engine has stopped ({self.dead_reason})")
                return  # nothing runs any more: nothing to abort
            self._commands.put(command)
        self._wake.set()

    # --- engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                arrived_tokens = self._apply_commands()
                if arrived_tokens:
                    self._gather_arrivals(arrived_tokens)
                self._expire_waiting()
                if not self.engine.has_unfinished():
                    self.snapshot = EngineSnapshot.take(self.engine, self.throughput)
                    self.watched.idle(self.engine, self.snapshot)
                    woken = self._wake.wait(timeout=IDLE_TRIM_S)
                    self._wake.clear()
                    if not woken and self._stepped_since_trim:  # idle a while after work (heap.py)
                        self._stepped_since_trim = False
                        self.trim_heap()
                    continue
                self._step()
                self._stepped_since_trim = True
        except BaseException as exc:  # FatalEngineError, or a failure outside a step
            log.critical("the engine thread died", exc_info=True)
            self._die(f"{type(exc).__name__}: {exc}")
            return
        self._fail_all(ShuttingDown("the server stopped before this request finished"), "shutdown")

    def _step(self) -> None:
        prefilled = self.engine.stats.prefill_tokens_total
        started = time.monotonic()
        try:
            outputs = self.engine.step()
        except FatalEngineError:
            raise
        except Exception as exc:  # a bug: fail what is running, keep serving
            log.exception("engine step failed")
            self._fail_all(EngineFailure(f"internal error while generating: {type(exc).__name__}"), "error")
            return
        now = time.monotonic()
        rows = self.engine.stats.prefill_tokens_total - prefilled
        if rows >= MEASURED_PREFILL_ROWS:
            self.prefill_row_s = (now - started) / rows
        self.throughput.add(now, len(outputs))
        self.snapshot = EngineSnapshot.take(self.engine, self.throughput)  # before replies go out
        self.watched.stepped(self.engine, self.snapshot, now, len(outputs))
        for out in outputs:
            tracked = self._requests.get(out.request_id)
            if tracked is None:
                continue
            self._observe_output(tracked, out, now)
            if out.finished:
                tracked.unfinished_choices -= 1
            if tracked.unfinished_choices == 0:  # recorded before the reply goes out, like the snapshot
                del self._requests[out.request_id]
                self._observe_finished(tracked, out.finish_reason or "stop", now)
            tracked.deliver(out)

    def _gather_arrivals(self, tokens: int) -> None:
        """Clients that send together (a burst, an agent's parallel calls) reach this thread
        milliseconds apart, each after its own parse, template and tokenization. Stepping at the
        first would prefill it alone and leave the rest a whole prefill step behind; instead wait
        for another arrival as long as ARRIVAL_SHARE of the gathered prompts' estimated prefill
        (tokens x the last measured time per prefill row), at most arrival_window_s, so a lone
        request pays a small share of its own prefill and a burst prefills as one batch."""
        while True:
            estimate = self.arrival_window_s if self.prefill_row_s is None else tokens * self.prefill_row_s * ARRIVAL_SHARE
            window = min(self.arrival_window_s, estimate)
            if window <= 0:
                return
            self._wake.clear()
            if self._commands.empty() and not self._wake.wait(window):
                return
            arrived = self._apply_commands()
            if not arrived:
                return
            tokens += arrived

    def _apply_commands(self) -> int:
        """Applies the queued commands; returns the prompt tokens of the requests they added."""
        added = 0
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return added
            if isinstance(command, _Abort):
                tracked = self._requests.pop(command.request_id, None)
                if self.engine.abort(command.request_id) and tracked is not None:
                    self._observe_finished(tracked, "abort", time.monotonic())
            elif isinstance(command, _AbortAll):
                self._fail_all(ShuttingDown(command.reason), "shutdown")
            else:
                try:
                    if command.pooling:
                        seq = self.engine.add_pooling(command.request_id, command.prompt, command.arrival_time)
                    else:
                        seq = self.engine.add_request(command.request_id, command.prompt, command.params,
                                                      command.arrival_time, command.priority)
                except Exception as exc:
                    command.deliver(exc)
                    continue
                self._requests[command.request_id] = _Tracked(seq, command.deliver, command.params.n)
                added += len(command.prompt)

    def _expire_waiting(self) -> None:
        """Fail the requests that waited longer than queue_timeout_s without being scheduled."""
        if self.queue_timeout_s is None:
            return
        now = time.monotonic()
        for request_id, tracked in list(self._requests.items()):
            waited = now - tracked.seq.arrival_time
            if tracked.seq.first_scheduled_time is None and waited > self.queue_timeout_s:
                del self._requests[request_id]
                self.engine.abort(request_id)
                tracked.deliver(QueueTimeout(f"the request waited {waited:.1f} s in the queue without being "
                                             f"scheduled (--queue-timeout {self.queue_timeout_s:g} s)"))
                self._observe_finished(tracked, "queue_timeout", now)

    def _fail_all(self, error: EngineFailure, reason: str) -> None:
        now = time.monotonic()
        for request_id, tracked in list(self._requests.items()):
            self.engine.abort(request_id)
            tracked.deliver(error)
            self._observe_finished(tracked, reason, now)
        self._requests.clear()

    def _die(self, reason: str) -> None:
        """Refuse new requests and fail every open one. The engine's own state is not touched
        again: after a fatal error it cannot be trusted."""
        with self._lock:
            self.dead_reason = reason
        error = EngineDead(f"the engine has stopped ({reason})")
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Add):
                command.deliver(error)
        for tracked in self._requests.values():
            tracked.deliver(error)
        self._requests.clear()

    # --- observers ----------------------------------------------------------------------
    def _observe_output(self, tracked: _Tracked, out: RequestOutput, now: float) -> None:
        if not out.new_token_ids:
            return
        previous = tracked.last_output_time
        if previous is None:
            self._notify(lambda o: o.on_first_token(RequestRecord.of(tracked.seq)))
        # n choices output in the same step: one interval per step, not zeros for the others
        interval = None if previous is None or previous == now else now - previous
        tracked.last_output_time = now
        self._notify(lambda o: o.on_tokens(len(out.new_token_ids), interval))

    def _observe_finished(self, tracked: _Tracked, reason: str, now: float) -> None:
        record = RequestRecord.of(tracked.seq, now, reason)
        self._notify(lambda o: o.on_finished(record))

    def _notify(self, call: Callable[[RequestObserver], None]) -> None:
        for observer in self.observers:
            try:
                call(observer)
            except Exception:  # metrics must never take the engine down
                log.exception("request observer %r failed", observer)
