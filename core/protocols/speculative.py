"""Speculative decoding: a proposer of draft tokens, and the backend ability to verify them (a
cache rolling back rejected positions is kv.Rewinding)."""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from ..sampling.params import SamplingParams


@runtime_checkable
class Proposer(Protocol):
    """Guesses tokens likely to follow a context, cheaply (hook ``register_proposers``).

    The engine runs the guesses as extra positions of the sequence's chunk and keeps only what
    verification accepts, so a bad guess costs compute, never correctness.
    """

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """At most max_tokens tokens to try after token_ids (prompt + output); [] for none."""


@runtime_checkable
class DraftVerifying(Protocol):
    """A sampler that verifies a sampled request's drafts by rejection sampling, so what it emits
    is distributed exactly as normal decoding. Greedy drafts need no such ability (any sampler's
    argmax verifies them); a sampler without it runs sampled requests without speculation."""

    def verify_draft(self, logits: Any, params: SamplingParams, generator: Any, draft: Sequence[int]) -> list[int]:
        """logits [len(draft) + 1, vocab]: row i scores the token after draft[:i]. Returns the
        accepted prefix of draft plus one token drawn from the target: the draft is a point
        mass q, so draft[i] is kept with probability p(draft[i]); on the first rejection one
        token is drawn from p with draft[i] removed (renormalized) and verification stops; if
        all are kept, one token is drawn from the last row. Draws come from the request's own
        generator, so a seeded request replays the same tokens."""
