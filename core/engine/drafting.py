"""Which sequences speculate this step, and how many tokens they may try.

Speculation is only ever an optimization, so it is switched off for a request wherever keeping
it exact would need more machinery than it saves: a request with any logits processor active
(penalties, logit_bias, min_tokens, a grammar: their state advances token by token) or with
logprobs asked for; a sampled request when the sampler cannot verify sampled drafts; every
request when the KV cache cannot rewind. Proposals never exceed what max_tokens leaves after
the one token the target model always adds.
"""
from __future__ import annotations

import logging
from typing import Any
from typing import Sequence as Seq

from ..protocols import DraftRequest, DraftVerifying, Proposer, ProposesFromHiddenStates, ScheduledChunk
from .sequence import Sequence

log = logging.getLogger("qwen_serve.engine")


class Drafter:
    def __init__(self, proposer: Proposer | ProposesFromHiddenStates, num_speculative_tokens: int,
                 sampler: Any) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.verifies_sampled = isinstance(sampler, DraftVerifying)
        self.from_hidden_states = isinstance(proposer, ProposesFromHiddenStates)

    def limit(self, seq: Sequence) -> int:
        """How many proposals seq may verify this step (0: it decodes one token as usual)."""
        p = seq.params
        if seq.logits_states or p.logprobs is not None or not p.speculative:
            return 0
        if not p.greedy and not self.verifies_sampled:
            return 0
        return max(0, min(self.num_speculative_tokens, p.max_tokens - len(seq.output_token_ids) - 1))

    def draft(self, seq: Sequence, spare_tokens: int) -> list[int]:
        """Proposals for seq, at most spare_tokens of them (the step's token budget left)."""
        limit = min(self.limit(seq), spare_tokens)
        if self.from_hidden_states:
            guesses, seq.next_draft = seq.next_draft, []
            return guesses[:max(limit, 0)]
        if limit <= 0:
            return []
        return [int(t) for t in self.proposer.propose(seq.token_ids(), limit)][:limit]

    def after_step(self, executor: Any, cache: Any, chunks: Seq[tuple[int, ScheduledChunk, Sequence]]) -> None:
        """A hidden-state proposer continues the step just run: every chunk whose sequence goes
        on hands over its kept rows and the token after each (so the proposer's own layers see
        every position), and a sequence that may speculate next step gets its guesses then.
        Positions its later guesses sit at are made writable first, as the next step would."""
        requests = []
        for index, chunk, seq in chunks:
            kept = seq.num_computed - chunk.start
            if seq.is_finished or kept <= 0:
                continue
            num_draft = self.limit(seq) if chunk.sample else 0
            if num_draft > 1 and not cache.allocate_slots(seq.seq_id, seq.num_computed, num_draft - 1,
                                                          seq.max_total_tokens):
                num_draft = 1  # its first guess needs no new position
            tokens = seq.token_ids()
            requests.append(DraftRequest(index, seq.seq_id, chunk.start,
                                         tuple(tokens[chunk.start + 1:chunk.start + kept + 1]), num_draft))
        if not requests:
            return
        try:
            drafts = self.proposer.propose_after_step(executor, cache, requests)
        except Exception:  # speculation is only an optimization: the sequences decode without guesses
            log.exception("the %s proposer failed after a step", type(self.proposer).__name__)
            return
        by_id = {seq.seq_id: seq for _, _, seq in chunks}
        for request, guesses in zip(requests, drafts):
            by_id[request.seq_id].next_draft = [int(t) for t in guesses][:request.num_draft]
