"""Continuous batching with chunked prefill.

Each step: every running sequence that is decoding gets its one token first, then sequences
still prefilling get chunks, then waiting sequences are admitted in arrival order while the
token budget and batch size allow. A waiting sequence is admitted only if the cache can hold
its whole prompt (after prefix hits). When a decode finds no free block, the most recently
admitted sequence is preempted: its blocks are freed and it is recomputed later, keeping its
generated tokens and its random state, so preemption never changes the output.

With ``batching="static"`` (a baseline to measure continuous batching against) admission
waits until every running sequence has finished: a batch is whatever got admitted before its
first token was sampled, and it holds its slots until its longest member is done.
"""
from __future__ import annotations

from collections import deque

from ..config import EngineConfig
from ..protocols import KVCache, PrefixCaching, ScheduledChunk, StepBatch
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, cache: KVCache, config: EngineConfig) -> None:
        self.cache = cache
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepBatch:
        budget = self.config.step_budget
        chunks: list[ScheduledChunk] = []
        for seq in [s for s in self.running if s.num_uncomputed == 1]:
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if not self._make_room(seq):
                continue
            chunks.append(self._chunk(seq, 1))
            budget -= 1
        for seq in [s for s in self.running if s.num_uncomputed > 1]:
            if budget <= 0:
                break
            n = min(self.config.chunk_size, seq.num_uncomputed, budget)
            chunks.append(self._chunk(seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.config.max_batch and self._batch_open():
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            n = min(self.config.chunk_size, seq.num_uncomputed, budget)
            chunks.append(self._chunk(seq, n))
            budget -= n
        return StepBatch(tuple(chunks))

    def _batch_open(self) -> bool:
        """Continuous: always. Static: until a running sequence has produced a token."""
        return self.config.batching == "continuous" or all(not s.output_token_ids for s in self.running)

    def _chunk(self, seq: Sequence, n: int) -> ScheduledChunk:
        start = seq.num_computed
        tokens = seq.token_ids()[start:start + n]
        return ScheduledChunk(seq.seq_id, tokens, start, sample=start + n == seq.num_tokens)

    def _admit(self, seq: Sequence) -> bool:
        """Attach prefix hits and reserve the whole remaining prompt, or leave seq waiting."""
        tokens = seq.token_ids()
        cached = self.cache.match_prefix(seq.seq_id, tokens) if isinstance(self.cache, PrefixCaching) else 0
        if not self.cache.allocate_slots(seq.seq_id, cached, len(tokens) - cached, seq.max_total_tokens):
            self.cache.free(seq.seq_id)
            return False
        seq.num_computed = cached
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = cached
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    def _make_room(self, seq: Sequence) -> bool:
        """Reserve one more position for seq, preempting newer sequences if the pool is full."""
        while not self.cache.allocate_slots(seq.seq_id, seq.num_computed, 1, seq.max_total_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.free(seq.seq_id)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire seq wherever it is and give its blocks back at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.free(seq.seq_id)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
