"""Which sequences speculate this step, and how many tokens they may try.

Speculation is only ever an optimization, so it is switched off for a request wherever keeping
it exact would need more machinery than it saves: a request with any logits processor active
(penalties, logit_bias, min_tokens, a grammar: their state advances token by token) or with
logprobs asked for; a sampled request when the sampler cannot verify sampled drafts; every
request when the KV cache cannot rewind. Proposals never exceed what max_tokens leaves after
the one token the target model always adds.
"""
from __future__ import annotations

from typing import Any

from ..protocols import DraftVerifying, Proposer
from .sequence import Sequence


class Drafter:
    def __init__(self, proposer: Proposer, num_speculative_tokens: int, sampler: Any) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.verifies_sampled = isinstance(sampler, DraftVerifying)

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
        if limit <= 0:
            return []
        return [int(t) for t in self.proposer.propose(seq.token_ids(), limit)][:limit]
