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

Under the "priority" policy (EngineConfig.scheduling_policy) the waiting queue is kept in
(priority, arrival) order, lower values first as in vLLM; the sequence preempted for a decode
is the lowest-ranked running one; and a waiting sequence that cannot be admitted for lack of
KV blocks preempts running sequences of a strictly lower priority until it fits. (A full
batch alone never preempts: the better-ranked sequence takes the next free slot.)

With a Drafter (speculative decoding), a sequence past its first token may carry proposed
tokens after its last real one, in the chunk that ends at its last token. Decodes get them only
once every decode has its own position, so drafts never push another sequence out, and the step
budget counts them. The last chunk of a preempted sequence's recomputation carries them too, so a
seeded request draws the same way whether or not it was preempted.
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from typing import TYPE_CHECKING

from ..config import EngineConfig
from ..protocols import KVCache, PrefixCaching, ScheduledChunk, StepBatch
from .sequence import Sequence, Status

if TYPE_CHECKING:
    from .drafting import Drafter


class Scheduler:
    def __init__(self, cache: KVCache, config: EngineConfig, drafter: "Drafter | None" = None) -> None:
        self.cache = cache
        self.config = config
        self.drafter = drafter
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.by_priority = config.scheduling_policy == "priority"

    def add(self, seq: Sequence) -> None:
        self._enqueue(seq, front=False)

    def _enqueue(self, seq: Sequence, front: bool) -> None:
        """fcfs: arrivals at the back, preempted sequences at the front; priority: by rank."""
        if not self.by_priority:
            self.waiting.appendleft(seq) if front else self.waiting.append(seq)
        else:
            self.waiting.insert(bisect.bisect_right(self.waiting, _rank(seq), key=_rank), seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepBatch:
        chunks: list[ScheduledChunk] = []
        for seq in [s for s in self.running if s.num_uncomputed == 1]:
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            if not self._make_room(seq, chunks):
                continue
            chunks.append(self._chunk(seq, 1))
        if self.drafter is not None:
            self._add_drafts(chunks)
        budget = self.config.step_budget - sum(len(c.token_ids) for c in chunks)
        for seq in [s for s in self.running if s.num_uncomputed > 1]:
            if budget <= 0:
                break
            n = min(self.config.chunk_size, seq.num_uncomputed, budget)
            chunks.append(self._drafted(seq, self._chunk(seq, n), budget - n))
            budget -= len(chunks[-1].token_ids)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_batch and self._batch_open():
            seq = self.waiting[0]
            if not self._admit(seq):
                refund = self._preempt_for(seq, chunks)
                if refund is None:
                    break
                budget += refund
                continue
            self.waiting.popleft()
            n = min(self.config.chunk_size, seq.num_uncomputed, budget)
            chunks.append(self._drafted(seq, self._chunk(seq, n), budget - n))
            budget -= len(chunks[-1].token_ids)
        return StepBatch(tuple(chunks))

    def _batch_open(self) -> bool:
        """Continuous: always. Static: until a running sequence has produced a token."""
        return self.config.batching == "continuous" or all(not s.output_token_ids for s in self.running)

    def _chunk(self, seq: Sequence, n: int) -> ScheduledChunk:
        start = seq.num_computed
        tokens = seq.token_ids()[start:start + n]
        return ScheduledChunk(seq.seq_id, tokens, start, sample=start + n == seq.num_tokens)

    def _add_drafts(self, chunks: list[ScheduledChunk]) -> None:
        """Give decodes their proposals within the budget the decodes leave."""
        spare = self.config.step_budget - len(chunks)
        by_id = {s.seq_id: s for s in self.running}
        for i, chunk in enumerate(chunks):
            chunks[i] = self._drafted(by_id[chunk.seq_id], chunk, spare)
            spare -= chunks[i].num_draft

    def _drafted(self, seq: Sequence, chunk: ScheduledChunk, spare: int) -> ScheduledChunk:
        """chunk with seq's proposals appended, if it ends at seq's last token, seq is past its
        first token and the cache has room for them (otherwise chunk itself)."""
        if self.drafter is None or not chunk.sample or not seq.output_token_ids or spare <= 0:
            return chunk
        draft = self.drafter.draft(seq, spare)
        if not draft or not self.cache.allocate_slots(seq.seq_id, seq.num_tokens, len(draft), seq.max_total_tokens):
            return chunk
        return ScheduledChunk(seq.seq_id, list(chunk.token_ids) + draft, chunk.start, True, num_draft=len(draft))

    def _admit(self, seq: Sequence) -> bool:
        """Attach prefix hits and reserve the whole remaining prompt, or leave seq waiting."""
        if seq.forks and len(self.running) + 1 + len(seq.forks) > self.config.max_batch:
            return False  # the choices that fork this prompt must find a place in the batch too
        tokens = seq.token_ids()
        cached = self.cache.match_prefix(seq.seq_id, tokens) if isinstance(self.cache, PrefixCaching) else 0
        if not self.cache.allocate_slots(seq.seq_id, cached, len(tokens) - cached, seq.max_total_tokens):
            self.cache.free(seq.seq_id)
            return False
        seq.num_computed = cached
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = cached
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    def _make_room(self, seq: Sequence, chunks: list[ScheduledChunk]) -> bool:
        """Reserve one more position for seq, preempting others (the newest under fcfs, the
        lowest-ranked under priority) if the pool is full."""
        while not self.cache.allocate_slots(seq.seq_id, seq.num_computed, 1, seq.max_total_tokens):
            victim = self._victim()
            self._preempt_in_step(victim, chunks)
            if victim is seq:
                return False
        return True

    def adopt(self, seq: Sequence) -> None:
        """A sequence that already holds its computed blocks (a forked choice) joins the batch."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _victim(self) -> Sequence:
        return max(self.running, key=_rank) if self.by_priority else self.running[-1]

    def _preempt_for(self, seq: Sequence, chunks: list[ScheduledChunk]) -> int | None:
        """Priority policy: preempt the lowest-ranked running sequence if its priority is
        strictly lower than waiting seq's; returns the step tokens freed, None if none was."""
        if not self.by_priority or not self.running:
            return None
        victim = self._victim()
        if victim.priority <= seq.priority:
            return None
        return self._preempt_in_step(victim, chunks)

    def _preempt_in_step(self, victim: Sequence, chunks: list[ScheduledChunk]) -> int:
        """Preempt victim and drop the chunk it already had in this step; returns its tokens."""
        dropped = sum(len(c.token_ids) for c in chunks if c.seq_id == victim.seq_id)
        chunks[:] = [c for c in chunks if c.seq_id != victim.seq_id]
        self.preempt(victim)
        return dropped

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.free(seq.seq_id)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq, front=True)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire seq wherever it is and give its blocks back at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.free(seq.seq_id)
        seq.status = Status.FINISHED
        seq.finish_reason = reason


def _rank(seq: Sequence) -> tuple[int, float, int]:
    """Priority-policy order: lower priority value first, then earlier arrival."""
    return seq.priority, seq.arrival_time, seq.seq_id
