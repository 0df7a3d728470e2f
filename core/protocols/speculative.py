"""Speculative decoding: a proposer of draft tokens (from token ids, or from the model's own
hidden states through a draft head the executor runs), and the backend ability to verify them
(a cache rolling back rejected positions is kv.Rewinding)."""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class DraftRequest:
    """One chunk of the step just executed, as a draft head continues it: the first `rows` of the
    chunk were kept (computed and, for drafts, accepted), next_tokens[i] is the token that
    followed row i, and num_draft tokens are wanted after the last one (0: the head only keeps
    what it needs of these rows, e.g. its own keys and values for a prefill chunk)."""

    chunk: int  # index in the step's batch
    seq_id: int
    start: int  # the chunk's first position
    next_tokens: tuple[int, ...]  # one per kept row
    num_draft: int


@runtime_checkable
class DraftHead(Protocol):
    """An executor whose model carries draft layers of its own (a multi-token-prediction head,
    as Qwen3.5's checkpoints do, built when ModelConfig.draft_layers is set). It keeps the final
    hidden states of its last execute; draft() runs the head over the kept rows of that step
    (row i with the token after it), then on its own guesses for num_draft - 1 more positions,
    writing the head's keys and values into the cache at those positions (the engine has made
    them writable). Greedy: each draft is the head's argmax."""

    def draft(self, requests: Sequence[DraftRequest], cache: Any) -> list[list[int]]:
        """The drafts of each request, num_draft of them, in request order."""


@runtime_checkable
class NarrowsDraftVocabulary(Protocol):
    """A DraftHead that can score its guesses over part of the vocabulary (``--draft-vocab``).
    Each draft round scores the head's output against every row of the language-model head; on
    a small model with a large vocabulary (Qwen3.5-0.8B: 248,320 rows, ~40% of a decoded token's
    bytes) those reads are most of a draft's cost. Narrowed, a round reads only the kept rows;
    a guess outside them is never made, so acceptance may fall, never correctness: verification
    still scores every token."""

    def narrow_draft_vocabulary(self, token_ids: Sequence[int] | None) -> None:
        """Draft only among token_ids (sorted, distinct, below the vocabulary size) from now on;
        None: among every token again."""

    def draft_scoring(self) -> tuple[int, int]:
        """(tokens a draft round scores, bytes of the head it reads): the kept rows', or all."""


@runtime_checkable
class ProposesFromHiddenStates(Protocol):
    """A proposer that drafts from what the model computed in the step just run, not from token
    ids (hook ``register_proposers``, like any proposer). The engine builds the model with its
    draft layers for it and calls it after every step; the drafts wait for the sequence's next
    step."""

    def check_model(self, config: Any) -> None:
        """Raise ModelLoadError if the model (a ModelConfig) cannot serve this proposer."""

    def propose_after_step(self, executor: Any, cache: Any, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Drafts for each request (num_draft at most each), from the executor's last step."""
