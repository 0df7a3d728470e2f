"""What the engine thread publishes for the server to read: its counters, an immutable snapshot
after every step, the generated-token rate over a sliding window, and each request's timeline (a
RequestRecord handed to RequestObservers)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class EngineStats:
    """Counters since start; the server turns them into /metrics."""

    requests_total: int = 0
    prefill_tokens_total: int = 0
    decode_tokens_total: int = 0
    steps_total: int = 0
    draft_tokens_total: int = 0  # proposals verified (speculative decoding)
    accepted_draft_tokens_total: int = 0  # of those, the ones kept


class ThroughputWindow:
    """Generated tokens per second over the last `seconds` (engine thread only writes)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._events: deque[tuple[float, int]] = deque()

    def add(self, now: float, tokens: int) -> None:
        self._events.append((now, tokens))
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        return sum(n for _, n in list(self._events)) / self.seconds

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.seconds:
            self._events.popleft()


@dataclass(frozen=True)
class EngineSnapshot:
    requests_active: int
    queue_depth: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    prefix_cache_hits: int
    prefill_tokens_total: int
    decode_tokens_total: int
    tokens_per_sec: float
    preemptions_total: int
    spec_draft_tokens_total: int = 0  # speculative decoding: proposals verified
    spec_accepted_tokens_total: int = 0  # of those, the ones kept

    @classmethod
    def take(cls, engine: Any, throughput: ThroughputWindow) -> "EngineSnapshot":
        usage = engine.cache.usage()
        scheduler = engine.scheduler
        return cls(
            requests_active=len(scheduler.running) + len(scheduler.waiting),
            queue_depth=len(scheduler.waiting),
            kv_blocks_total=usage.total,
            kv_blocks_used=usage.used,
            kv_blocks_cached=usage.cached,
            prefix_cache_hits=usage.prefix_hit_blocks,
            prefill_tokens_total=engine.stats.prefill_tokens_total,
            decode_tokens_total=engine.stats.decode_tokens_total,
            tokens_per_sec=throughput.rate(time.monotonic()),
            preemptions_total=scheduler.num_preemptions,
            spec_draft_tokens_total=engine.stats.draft_tokens_total,
            spec_accepted_tokens_total=engine.stats.accepted_draft_tokens_total,
        )


@dataclass(frozen=True)
class RequestRecord:
    """One request's life as the engine saw it (monotonic seconds), for metrics and the request
    log. finish_reason is None while the request still runs."""

    request_id: str
    priority: int
    prompt_token_ids: tuple[int, ...]
    cached_tokens: int
    completion_tokens: int
    num_preemptions: int
    arrival_time: float
    scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None = None
    finish_reason: str | None = None

    @classmethod
    def of(cls, seq: Any, finished_time: float | None = None, finish_reason: str | None = None) -> "RequestRecord":
        return cls(seq.request_id, seq.priority, tuple(seq.prompt_token_ids), seq.num_cached_prompt_tokens,
                   len(seq.output_token_ids), seq.num_preemptions, seq.arrival_time, seq.first_scheduled_time,
                   seq.first_token_time, finished_time, finish_reason)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def queue_s(self) -> float | None:
        """From arrival until it first left the waiting queue."""
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


class RequestObserver(Protocol):
    """Told about each request's progress, on the engine thread: must be quick. (The engine
    thread logs and survives an observer that raises.)"""

    def on_first_token(self, record: RequestRecord) -> None: ...

    def on_tokens(self, num_tokens: int, interval_s: float | None) -> None:
        """One output of num_tokens; interval_s since the request's previous output (None for its first)."""

    def on_finished(self, record: RequestRecord) -> None:
        """Also for requests that never ran: aborted, timed out in the queue, failed."""
