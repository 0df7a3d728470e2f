"""What the engine thread publishes for the server to read: an immutable snapshot after every
step, and the generated-token rate over a sliding window."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any


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
        )
