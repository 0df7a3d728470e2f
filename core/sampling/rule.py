"""The sampling rule, written once on numpy arrays: every backend turns its logits into float32
numpy rows and hands them here, so the same logits and seed give the same tokens on each.

Per row, in this order: the logits processors' adjustment (penalties, then biases, then masks;
greedy rows included); temperature 0 -> the first maximum; otherwise (logits - max) / T in
float64 -> top-k -> softmax -> top-p (at least one token kept) -> min-p -> one draw (an exponential race)
from the request's own generator. Log-probabilities stay the model's own, from the raw logits.
Speculative drafts are verified by rejection sampling against a point-mass proposal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .adjustment import BatchAdjustment
from .params import SamplingParams

FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None] = field(default_factory=list)


def make_generator(seed: int) -> np.random.Generator:
    """A request's own random stream, seeded once. Any int64 seed works (a negative one wraps
    modulo 2**64, as torch's manual_seed does)."""
    return np.random.Generator(np.random.PCG64(seed % 2**64))


def sample(logits: np.ndarray, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator],
           adjustment: BatchAdjustment | None = None) -> SampleResult:
    """One token per row of float32 logits [rows, vocab], each row with its own params and generator."""
    adjusted = logits if adjustment is None else adjusted_logits(logits, adjustment)
    tokens: list[int] = []
    logprobs: list[dict[int, float] | None] = []
    for row, raw_row, p, generator in zip(adjusted, logits, params, generators):
        # numpy's argmax over Qwen3's 151,936 logits takes ~12 us (torch's took ~130); a NaN counts as the maximum
        token = int(row.argmax()) if p.greedy else draw(weights(row, p), generator)
        tokens.append(token)
        logprobs.append(None if p.logprobs is None else top_logprobs(raw_row, p.logprobs, token))
    return SampleResult(tokens, logprobs)


def verify_draft(logits: np.ndarray, params: SamplingParams, generator: np.random.Generator,
                 draft: Sequence[int]) -> list[int]:
    """Rejection sampling against a point-mass proposal: keep draft[i] with probability
    p(draft[i]), else draw from p without draft[i] (renormalized) and stop; if every draft is
    kept, one more token from the last row. logits [len(draft) + 1, vocab], float32."""
    emitted: list[int] = []
    for i, token in enumerate(draft):
        probs = weights(logits[i], params)
        probs /= probs.sum()
        if generator.random() < probs[token]:
            emitted.append(int(token))
            continue
        probs[token] = 0.0
        emitted.append(draw(probs, generator))
        return emitted
    emitted.append(draw(weights(logits[len(draft)], params), generator))
    return emitted


def adjusted_logits(logits: np.ndarray, adjustment: BatchAdjustment) -> np.ndarray:
    """A copy of float32 logits [batch, vocab] with penalties, then biases, then masks applied."""
    out = logits.copy()
    a = adjustment
    if len(a.penalty_rows):
        picked = out[a.penalty_rows, a.penalty_ids]
        with np.errstate(over="ignore"):  # a tiny factor overflows float32: clipped back to finite below
            penalized = np.where(picked < 0, picked * a.penalty_factors, picked / a.penalty_factors)  # transformers'
        out[a.penalty_rows, a.penalty_ids] = np.clip(penalized, -FLOAT32_MAX, FLOAT32_MAX)
    if len(a.bias_rows):
        out[a.bias_rows, a.bias_ids] += a.bias_values  # (row, id) pairs are unique
    if len(a.mask_rows):
        out[a.mask_rows] = np.where(a.allowed_tokens(out.shape[1]), out[a.mask_rows], -np.inf)
    return out


def weights(row: np.ndarray, p: SamplingParams) -> np.ndarray:
    """What a sampled row draws from: float64 [vocab], summing to 1 before top-p / min-p remove tokens."""
    kept = top_k_tokens(row, p.top_k)
    values = (row if kept is None else row[kept]).astype(np.float64)
    # max-subtracted in float64: a temperature as small as 1e-300 sends the others to -inf, never NaN
    with np.errstate(over="ignore", invalid="ignore"):  # invalid: NaN or all--inf rows, which draw() refuses
        probs = np.exp((values - values.max()) / p.temperature)
        probs /= probs.sum()
    if p.top_p < 1.0:
        order, mass_through = nucleus_candidates(probs, p.top_p)
        descending = probs[order]
        mass_before = mass_through - descending  # 0 for the first: it always stays
        probs[:] = 0.0
        probs[order] = np.where(mass_before < p.top_p, descending, 0.0)
    if p.min_p > 0:  # top-p never removes the most likely token, so this max is softmax's
        probs[probs < p.min_p * probs.max()] = 0.0
    if kept is None:
        return probs
    every = np.zeros(row.size)
    every[kept] = probs
    return every


def top_k_tokens(row: np.ndarray, top_k: int) -> np.ndarray | None:
    """The tokens top-k keeps (ties with the k-th stay), found on the float32 row so that the
    rest of the rule works on k values instead of the whole vocabulary (Qwen3 asks for top-k 20
    of 151,936); None when top-k keeps every token, or when a NaN leaves no order to go by (the
    draw refuses such a row)."""
    if not 0 < top_k < row.size or np.isnan(row.max()):
        return None
    kth = np.partition(row, row.size - top_k)[row.size - top_k]
    return np.flatnonzero(row >= kth)


def nucleus_candidates(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens top-p might keep, most likely first, and their running mass. Tokens below
    (1 - top_p) / vocab hold less than 1 - top_p together and sort after all the others, so top-p
    drops them: only the rest is sorted (a few hundred of Qwen3's 151,936 on a confident step),
    unless rounding leaves the rest short of top_p; zeros are never sorted."""
    for kept in (np.flatnonzero(probs >= (1.0 - top_p) / probs.size), np.flatnonzero(probs)):
        order = kept[np.argsort(-probs[kept])]
        mass_through = np.cumsum(probs[order])
        if mass_through.size and mass_through[-1] >= top_p:
            break
    return order, mass_through


def draw(weights: np.ndarray, generator: np.random.Generator) -> int:
    """One index with probability weights[i] / sum(weights), by an exponential race: each token
    with a weight gets its own Exp(1) draw and the largest weight / draw wins (what torch's
    multinomial does for one sample). A tiny change in the weights (prefill against decode
    attention after a preemption, ~1e-7) flips the winner only when the two best ratios are that
    close; an inverse CDF over 151,936 near-equal weights flips whenever the uniform lands within
    the CDF's rounding of a boundary. A zero weight is never drawn."""
    support = np.flatnonzero(weights)
    total = weights[support].sum()
    if not (np.isfinite(total) and total > 0):
        raise ValueError(f"nothing to draw from: the weights sum to {total} (NaN logits, or every token masked)")
    if support.size == 1:
        return int(support[0])
    race = weights[support] / generator.standard_exponential(support.size)
    return int(support[race.argmax()])


def top_logprobs(row: np.ndarray, k: int, chosen: int) -> dict[int, float]:
    """The model's log-probabilities (before temperature or filters): the chosen token, then the top k."""
    shifted = row.astype(np.float64) - row.max()
    logp = shifted - np.log(np.exp(shifted).sum())
    out = {chosen: float(logp[chosen])}
    k = min(k, logp.size)
    if k > 0:
        ids = np.argpartition(-logp, k - 1)[:k]
        ids = ids[np.argsort(-logp[ids], kind="stable")]
        out.update(zip(ids.tolist(), logp[ids].tolist()))
    return out
