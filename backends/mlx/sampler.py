"""Sampling in a fixed order: the logits processors' adjustment (penalties, biases,
grammar masks) on the whole batch at once, then temperature 0 -> argmax (first maximum); otherwise
logits / T -> top-k -> softmax -> top-p (at least one token kept) -> min-p -> one draw.

A request's randomness is an MLX PRNG key made once from its seed and split for every draw,
so the same seed replays the same draws whatever else shares the batch.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from qwen_serve.protocols import SampleResult
from qwen_serve.sampling.adjustment import BatchAdjustment
from qwen_serve.sampling.params import SamplingParams

from .mx import mx

FLOAT32_MAX = float(np.finfo(np.float32).max)


class RequestKey:
    """A request's PRNG key chain: seeded once, split per draw."""

    def __init__(self, seed: int) -> None:
        self.key = mx.random.key(seed)
        mx.eval(self.key)  # usable from any thread: MLX evaluates only on the recording thread

    def next(self) -> mx.array:
        self.key, draw = mx.random.split(self.key)
        mx.eval(self.key, draw)
        return draw


class MLXSampler:
    def make_generator(self, seed: int) -> RequestKey:
        return RequestKey(seed)

    def sample(self, logits: mx.array, params: Sequence[SamplingParams], generators: Sequence[RequestKey],
               adjustment: BatchAdjustment | None = None) -> SampleResult:
        raw = logits.astype(mx.float32)
        adjusted = raw if adjustment is None else apply_adjustment(raw, adjustment)
        greedy = mx.argmax(adjusted, axis=-1).tolist() if any(p.greedy for p in params) else []
        tokens: list[int] = []
        logprobs: list[dict[int, float] | None] = []
        for i, (p, key) in enumerate(zip(params, generators)):
            token = greedy[i] if p.greedy else self._draw(adjusted[i], p, key)
            tokens.append(token)
            logprobs.append(None if p.logprobs is None else top_logprobs(raw[i], p.logprobs, token))
        return SampleResult(tokens, logprobs)

    @staticmethod
    def _draw(row: mx.array, p: SamplingParams, key: RequestKey) -> int:
        with mx.stream(mx.cpu):
            probs, order = filtered(row, p)
            index = mx.random.categorical(mx.log(probs).astype(mx.float32), key=key.next())
            return int((index if order is None else order[index]).item())

    def verify_draft(self, logits: mx.array, params: SamplingParams, generator: RequestKey,
                     draft: Sequence[int]) -> list[int]:
        """Rejection sampling against a point-mass proposal (DraftVerifying): keep draft[i] with
        probability p(draft[i]), else draw from p without draft[i] and stop."""
        rows = logits.astype(mx.float32)
        emitted: list[int] = []
        for i, token in enumerate(draft):
            with mx.stream(mx.cpu):
                probs, order = filtered(rows[i], params)
                if order is not None:  # back to vocabulary order
                    probs = mx.zeros_like(probs).at[order].add(probs)
                probs = probs / probs.sum()
                if mx.random.uniform(key=generator.next()).item() < probs[token].item():
                    emitted.append(int(token))
                    continue
                residual = mx.where(mx.arange(probs.size) == token, 0.0, probs)
                emitted.append(int(mx.random.categorical(mx.log(residual).astype(mx.float32), key=generator.next()).item()))
                return emitted
        emitted.append(self._draw(rows[len(draft)], params, generator))
        return emitted


def filtered(row: mx.array, p: SamplingParams) -> tuple[mx.array, mx.array | None]:
    """The weights a sampled row draws from (float64, not normalized after top-p / min-p), and
    with top-p the permutation they are in (None: vocabulary order). Runs on the CPU stream."""
    # float64 and max-subtracted: a temperature as small as 1e-300 must not overflow to NaN
    # (float64 runs on the CPU stream: MLX's GPU has none)
    row = row.astype(mx.float64)
    scaled = (row - row.max()) / p.temperature
    if 0 < p.top_k < scaled.size:
        kth = mx.topk(scaled, p.top_k).min()
        scaled = mx.where(scaled < kth, -mx.inf, scaled)
    probs = mx.softmax(scaled, axis=-1)
    order = None
    if p.top_p < 1.0:
        order = mx.argsort(-probs)
        probs = probs[order]
        mass_before = mx.cumsum(probs) - probs
        probs = mx.where(mass_before >= p.top_p, 0.0, probs)  # index 0 always stays
    if p.min_p > 0:  # top-p never removes the most likely token, so the max is softmax's
        probs = mx.where(probs < p.min_p * probs.max(), 0.0, probs)
    return probs, order


def apply_adjustment(logits: mx.array, adjustment: BatchAdjustment) -> mx.array:
    """float32 logits [batch, vocab] with penalties, then biases, then masks applied (a new array)."""
    a = adjustment
    if len(a.penalty_rows):
        rows, ids = mx.array(a.penalty_rows), mx.array(a.penalty_ids)
        picked, factors = logits[rows, ids], mx.array(a.penalty_factors)
        negative = picked < 0  # transformers' arithmetic: x * p below zero, x / p otherwise
        logits = logits.at[rows, ids].multiply(mx.where(negative, factors, 1.0))
        logits = logits.at[rows, ids].divide(mx.where(negative, 1.0, factors))
        # a tiny penalty overflows: keep the penalized logits finite (as torch's clamp)
        logits = logits.at[rows, ids].minimum(FLOAT32_MAX).at[rows, ids].maximum(-FLOAT32_MAX)
    if len(a.bias_rows):
        logits = logits.at[mx.array(a.bias_rows), mx.array(a.bias_ids)].add(mx.array(a.bias_values))
    if len(a.mask_rows):
        allowed = np.ones(logits.shape, dtype=bool)
        allowed[a.mask_rows] = a.allowed_tokens(logits.shape[1])
        logits = mx.where(mx.array(allowed), logits, -mx.inf)
    return logits


def top_logprobs(row: mx.array, k: int, chosen: int) -> dict[int, float]:
    """The model's log-probabilities (before temperature or filters): top k plus the chosen token."""
    logp = row - mx.logsumexp(row)
    out = {chosen: logp[chosen].item()}
    if k > 0:
        ids = mx.argpartition(-logp, k - 1)[:k]
        values = logp[ids]
        order = mx.argsort(-values)
        out.update(zip(ids[order].tolist(), values[order].tolist()))
    return out
