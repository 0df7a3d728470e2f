"""What the engine view at /engine draws: each request's phase and blocks, and the block pool.

Taken on the engine thread between steps, and only while someone watches (EngineWatch),
since walking every block costs what it costs. A KV cache that implements DescribesBlocks gives
its block states; any other still shows its requests and usage counts. Each second's generated
tokens and batch occupancy are kept for the last minutes (EngineHistory) so a page opened now
draws the past too.
"""
from __future__ import annotations

import contextlib
import re
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from ..protocols import BlockMap, DescribesBlocks
from .sequence import Sequence, Status
from .stats import EngineSnapshot

HISTORY_S = 300  # seconds of per-second history kept
MAX_TABLE_BLOCKS = 4096  # of a request's block table, at most this many ids are shown
RUN = re.compile(r"(.)\1*")
VIEW_INTERVAL_S = 0.2  # while watched, an engine view at most this often (and after each idle wake)


@dataclass(frozen=True)
class RequestView:
    request_id: str
    choice: int
    phase: str  # queued, prefill, decode or preempted (waiting to be recomputed)
    chunk: int  # prefill: the next chunk (1-based) of `chunks`; 0 otherwise
    chunks: int
    prompt_tokens: int
    cached_tokens: int  # served by the prefix cache
    computed_tokens: int
    output_tokens: int
    max_tokens: int
    preemptions: int
    age_s: float  # since arrival
    blocks: tuple[int, ...]  # its block table (released entries of a sliding window are negative)

    @classmethod
    def of(cls, seq: Sequence, cache: Any, chunk_size: int, now: float) -> "RequestView":
        chunk = chunks = 0
        if seq.status is Status.WAITING:
            phase = "preempted" if seq.num_preemptions else "queued"
        elif seq.num_uncomputed > 1:
            phase = "prefill"
            start = seq.num_cached_prompt_tokens if not seq.num_preemptions else 0
            chunks = max(1, -(-(seq.num_tokens - start) // chunk_size))
            chunk = min(chunks, (seq.num_computed - start) // chunk_size + 1)
        else:
            phase = "decode"
        table = tuple(cache.block_table(seq.seq_id)[:MAX_TABLE_BLOCKS]) if phase in ("prefill", "decode") else ()
        return cls(seq.request_id, seq.index, phase, chunk, chunks, len(seq.prompt_token_ids),
                   seq.num_cached_prompt_tokens, seq.num_computed, len(seq.output_token_ids), seq.params.max_tokens,
                   seq.num_preemptions, round(now - seq.arrival_time, 3), table)


class EngineHistory:
    """Generated tokens and the most sequences running, per second, for the last HISTORY_S
    seconds (engine thread only writes; a step costs one comparison and two additions)."""

    def __init__(self, seconds: int = HISTORY_S) -> None:
        self._seconds: deque[list[int]] = deque(maxlen=seconds)  # [second, tokens, running]

    def add(self, now: float, tokens: int, running: int) -> None:
        second = int(now)
        if self._seconds and self._seconds[-1][0] == second:
            last = self._seconds[-1]
            last[1] += tokens
            last[2] = max(last[2], running)
        else:
            self._seconds.append([second, tokens, running])

    def seconds(self) -> tuple[tuple[int, int, int], ...]:
        """(second of the monotonic clock, tokens, running) for each second that had a step."""
        return tuple((second, tokens, running) for second, tokens, running in list(self._seconds))


@dataclass(frozen=True)
class EngineView:
    taken_at: float  # monotonic
    max_batch: int
    block_size: int
    chunk_size: int
    cache: str  # the KV cache's class
    requests: tuple[RequestView, ...]
    blocks: BlockMap | None  # None: the cache cannot describe its blocks
    cow_copies: int
    states_total: int  # recurrent-state slots (hybrid models), 0 otherwise
    states_used: int
    state_snapshots: int
    snapshot: EngineSnapshot
    history: tuple[tuple[int, int, int], ...]  # EngineHistory.seconds()

    @classmethod
    def take(cls, engine: Any, snapshot: EngineSnapshot, history: EngineHistory) -> "EngineView":
        now = time.monotonic()
        scheduler, cache, config = engine.scheduler, engine.cache, engine.config
        requests = tuple(RequestView.of(seq, cache, config.chunk_size, now)
                         for seq in [*scheduler.running, *scheduler.waiting])
        usage = cache.usage()
        blocks = cache.describe_blocks() if isinstance(cache, DescribesBlocks) else None
        return cls(now, config.max_batch, cache.block_size, config.chunk_size, type(cache).__name__, requests, blocks,
                   usage.cow_copies, usage.states_total, usage.states_used, usage.state_snapshots, snapshot,
                   history.seconds())

    def as_json(self, history_s: float | None = None) -> dict[str, Any]:
        """The blocks run-length encoded ("u12.300c4": twelve in use, then 300 free, ...), so a
        mostly idle pool of thousands of blocks costs a few bytes; of the history, the seconds
        less than history_s old (all of it for None)."""
        body = asdict(self)
        now = body.pop("taken_at")
        body["now"] = int(now)
        if history_s is not None:
            body["history"] = [s for s in self.history if now - s[0] < history_s]
        body["blocks"] = None if self.blocks is None else {
            "total": len(self.blocks.states), "runs": run_lengths(self.blocks.states),
            "shared_refs": {str(k): v for k, v in self.blocks.shared_refs.items()}}
        return body


class EngineWatch:
    """The engine thread's side of watching: the history, always kept (it is cheap), and the
    latest EngineView, taken only while someone watches: after a step at most every
    VIEW_INTERVAL_S, and whenever the engine goes idle."""

    def __init__(self) -> None:
        self.history = EngineHistory()
        self.view: EngineView | None = None
        self._watchers = 0  # the event loop's thread alone changes it
        self._taken_at = 0.0

    @contextlib.contextmanager
    def opened(self) -> Iterator[None]:
        self._watchers += 1
        try:
            yield
        finally:
            self._watchers -= 1
            if not self._watchers:
                self.view = None

    def stepped(self, engine: Any, snapshot: EngineSnapshot, now: float, tokens: int) -> None:
        self.history.add(now, tokens, len(engine.scheduler.running))
        if self._watchers and now - self._taken_at >= VIEW_INTERVAL_S:
            self._take(engine, snapshot, now)

    def idle(self, engine: Any, snapshot: EngineSnapshot) -> None:
        if self._watchers:
            self._take(engine, snapshot, time.monotonic())

    def _take(self, engine: Any, snapshot: EngineSnapshot, now: float) -> None:
        self._taken_at = now
        self.view = EngineView.take(engine, snapshot, self.history)


def run_lengths(states: str) -> str:
    return "".join(f"{run.group(1)}{len(run.group(0))}" for run in RUN.finditer(states))
