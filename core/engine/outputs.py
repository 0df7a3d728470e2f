"""What the engine hands back after each step, one RequestOutput per request that moved."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestOutput:
    """What a step produced for one request: new tokens and the text they made final."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    new_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    index: int = 0  # which of the request's n choices (SamplingParams.n) this output belongs to
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (set on the final output)
    stop_reason: str | int | None = None  # what ended a "stop": the stop string or stop token id (None: EOS)
    pooled: Any = None  # a pooling request's result: a float32 numpy row (hidden state, or the scored logits)


def merged_outputs(first: RequestOutput, then: RequestOutput) -> RequestOutput:
    """One request's outputs of one step as one (a verified chunk emits several tokens)."""
    return RequestOutput(first.request_id, first.new_token_ids + then.new_token_ids, first.new_text + then.new_text,
                         then.finished, then.finish_reason, first.new_logprobs + then.new_logprobs,
                         index=then.index, num_cached_tokens=then.num_cached_tokens, stop_reason=then.stop_reason)
