"""A request's tokens and progress: pure data, no tensors."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ..sampling.params import SamplingParams
from .detokenizer import IncrementalDetokenizer


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: Any  # the sampler's per-request random state, seeded once
    detokenizer: IncrementalDetokenizer
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    num_computed: int = 0  # leading positions whose keys/values are in the cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None  # when it first left the waiting queue
    priority: int = 0  # lower runs first under the "priority" scheduling policy
    num_cached_prompt_tokens: int = 0  # from the prefix cache, for metrics
    num_preemptions: int = 0
    index: int = 0  # which of the request's n choices this is
    forks: list["Sequence"] = field(default_factory=list)  # choices that fork this one's prompt once it is computed
    logits_states: list[Any] = field(default_factory=list)  # the logits processors' states (qwen_serve.logits)
    pooled: Any = None  # an input to embed or score (Engine.add_pooling): its row, once finished
    next_draft: list[int] = field(default_factory=list)  # a hidden-state proposer's guesses, for the next step

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.params.max_tokens

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
