"""What one model call is given (a StepBatch of ScheduledChunks) and what sampling returns
(SampleResult, defined beside the sampling rule that makes it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..sampling.rule import SampleResult

__all__ = ["SampleResult", "ScheduledChunk", "StepBatch"]


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one sequence to run in a step: positions [start, start + len(token_ids))."""

    seq_id: int
    token_ids: Sequence[int]
    start: int
    sample: bool  # whether the last position's logits are wanted
    num_draft: int = 0  # the last num_draft tokens are proposals: with sample, logits of the last num_draft + 1 positions


@dataclass(frozen=True)
class StepBatch:
    """One model call: decode tokens and prefill chunks from several sequences."""

    chunks: tuple[ScheduledChunk, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)
