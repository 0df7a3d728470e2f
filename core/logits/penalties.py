"""The numeric processors of SamplingParams: penalties, logit_bias and min_tokens.

Each reads only the request's tokens and params, so it needs no memory of its own beyond what
is fixed at the start (the prompt's distinct tokens, the bias arrays): preemption, recomputation
and forked choices cannot put it out of step.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidRequest
from ..models.config import ModelConfig
from ..protocols import LogitsRequest
from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams

FLOAT32 = np.finfo(np.float32)


class _Stateless:
    def accept(self, token_id: int) -> None:
        pass


class Penalties:
    """presence_penalty and frequency_penalty as OpenAI defines them, over the generated tokens:
    ``logit[t] -= frequency * count(t) + presence * (count(t) > 0)``; repetition_penalty as
    CTRL / transformers' RepetitionPenaltyLogitsProcessor, over prompt and generated tokens: each
    token seen has its logit divided by the penalty if positive, multiplied if negative. The
    repetition penalty acts on the model's own logits, before any bias is added."""

    def __init__(self, model_config: ModelConfig) -> None:
        self.vocab_size = model_config.vocab_size

    def validate(self, params: SamplingParams) -> None:
        pass  # SamplingParams already bounds the values

    def start(self, request: LogitsRequest) -> "PenaltyState | None":
        p = request.params
        if not (p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0):
            return None
        return PenaltyState(p, request.prompt_token_ids)


class PenaltyState(_Stateless):
    def __init__(self, params: SamplingParams, prompt: list[int]) -> None:
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        repetition = params.repetition_penalty
        self.prompt_tokens = np.unique(np.asarray(prompt, dtype=np.int64)) if repetition != 1.0 else None
        # In float32's normal range: a penalty of 1e-320 must not become 0 there (x / 0 is inf, 0 / 0 NaN).
        self.factor = float(np.clip(repetition, FLOAT32.tiny, FLOAT32.max))

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        generated, counts = np.unique(np.asarray(request.output_token_ids, dtype=np.int64), return_counts=True)
        parts = {}
        if self.prompt_tokens is not None:
            seen = np.union1d(self.prompt_tokens, generated)
            parts.update(penalty_ids=seen, penalty_factors=np.full(len(seen), self.factor, dtype=np.float32))
        if (self.presence or self.frequency) and len(generated):
            values = -(self.frequency * counts + self.presence)
            parts.update(bias_ids=generated, bias_values=values.astype(np.float32))
        return LogitsAdjustment(**parts) if parts else None


class LogitBias:
    """OpenAI's logit_bias: a fixed value added to chosen tokens' logits at every step."""

    def __init__(self, model_config: ModelConfig) -> None:
        self.vocab_size = model_config.vocab_size

    def validate(self, params: SamplingParams) -> None:
        outside = [t for t, _ in params.logit_bias if t >= self.vocab_size]
        if outside:
            raise InvalidRequest(f"logit_bias: token id {outside[0]} is outside the vocabulary "
                                 f"(ids 0..{self.vocab_size - 1})", param="logit_bias")

    def start(self, request: LogitsRequest) -> "LogitBiasState | None":
        if not request.params.logit_bias:
            return None
        return LogitBiasState(request.params)


class LogitBiasState(_Stateless):
    def __init__(self, params: SamplingParams) -> None:
        ids, values = zip(*params.logit_bias)
        self.adjustment = LogitsAdjustment(bias_ids=np.array(ids, dtype=np.int64),
                                           bias_values=np.array(values, dtype=np.float32))

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment:
        return self.adjustment


class MinTokens:
    """min_tokens: EOS (unless ignore_eos, where it ends nothing) and stop_token_ids get -inf until
    that many tokens were generated, as vLLM does."""

    def __init__(self, model_config: ModelConfig) -> None:
        self.eos_token_ids = tuple(model_config.eos_token_ids)
        self.vocab_size = model_config.vocab_size

    def validate(self, params: SamplingParams) -> None:
        outside = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if outside:
            raise InvalidRequest(f"stop_token_ids: token id {outside[0]} is outside the vocabulary "
                                 f"(ids 0..{self.vocab_size - 1})", param="stop_token_ids")

    def start(self, request: LogitsRequest) -> "MinTokensState | None":
        p = request.params
        ended_by = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
        if p.min_tokens == 0 or not ended_by:
            return None
        return MinTokensState(p.min_tokens, sorted(ended_by))


class MinTokensState(_Stateless):
    def __init__(self, min_tokens: int, suppressed: list[int]) -> None:
        self.min_tokens = min_tokens
        self.suppression = LogitsAdjustment(bias_ids=np.array(suppressed, dtype=np.int64),
                                            bias_values=np.full(len(suppressed), -np.inf, dtype=np.float32))

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        return self.suppression if len(request.output_token_ids) < self.min_tokens else None
