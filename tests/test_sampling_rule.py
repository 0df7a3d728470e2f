"""One sampling rule for every backend: the same logits and seeds give the same tokens, the same
log-probabilities and the same speculative verification on torch and MLX; and the rule's edges
(NaN rows, tiny temperatures, filters that keep everything or almost nothing)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qwen_serve import SamplingParams
from qwen_serve.backends.mlx.mx import mx
from qwen_serve.backends.mlx.sampler import MLXSampler
from qwen_serve.backends.torch_cpu.sampler import TorchSampler
from qwen_serve.sampling import rule
from qwen_serve.sampling.adjustment import BatchAdjustment, LogitsAdjustment

VOCAB = 300
DRAWS = 150

ROWS = [  # (params, the row's logits-processor adjustment)
    (SamplingParams(), None),
    (SamplingParams(logprobs=3), LogitsAdjustment(bias_ids=np.array([7]), bias_values=np.array([50.0], np.float32))),
    (SamplingParams(temperature=1.0), None),
    (SamplingParams(temperature=0.7, top_k=20, logprobs=2), None),
    (SamplingParams(temperature=1.3, top_p=0.9), None),
    (SamplingParams(temperature=1.0, top_p=0.8, min_p=0.1), None),
    (SamplingParams(temperature=2.0, top_k=VOCAB + 5), None),
    (SamplingParams(temperature=1e-300), None),
    (SamplingParams(temperature=0.9, min_p=0.02),
     LogitsAdjustment(penalty_ids=np.array([0, 3, 11]), penalty_factors=np.full(3, 1.5, np.float32),
                      bias_ids=np.array([3, 40]), bias_values=np.array([2.0, -np.inf], np.float32))),
    (SamplingParams(temperature=1.1, top_k=50, top_p=0.95),
     LogitsAdjustment(allowed=np.packbits(np.arange(VOCAB + 20) % 3 != 0, bitorder="little").view(np.int32))),
]


def backends():
    return [(TorchSampler(), torch.from_numpy), (MLXSampler(), mx.array)]


def draws(sampler, to_backend, logits, seeds):
    """DRAWS steps of every row, each row drawing from its own generator; tokens and logprobs."""
    params = [p for p, _ in ROWS]
    adjustment = BatchAdjustment.of_rows([a for _, a in ROWS])
    generators = [sampler.make_generator(s) for s in seeds]
    rows = to_backend(logits)
    results = [sampler.sample(rows, params, generators, adjustment=adjustment) for _ in range(DRAWS)]
    return [r.token_ids for r in results], [r.logprobs for r in results]


@pytest.mark.parametrize("seeds", [range(len(ROWS)), [-3, 2**63 - 1, 0, 0, 5, 9, 11, 7, 13, 17]])
def test_both_backends_draw_the_same_tokens_from_the_same_logits_and_seeds(seeds):
    logits = (np.random.default_rng(0).standard_normal((len(ROWS), VOCAB)) * 3).astype(np.float32)
    (torch_tokens, torch_logprobs), (mlx_tokens, mlx_logprobs) = [draws(s, to, logits, seeds) for s, to in backends()]
    assert torch_tokens == mlx_tokens
    assert torch_logprobs == mlx_logprobs
    by_row = np.array(torch_tokens).T
    assert (by_row[0] == logits[0].argmax()).all() and (by_row[1] == 7).all()  # greedy, and greedy after the bias
    assert (by_row[7] == logits[7].argmax()).all()  # a temperature of 1e-300 is greedy
    assert all(len(set(by_row[i])) > 3 for i in (2, 3, 4, 6, 8, 9))  # the sampled rows really draw
    assert not {40} & set(by_row[8]) and all(t % 3 for t in by_row[9])  # -inf bias and mask hold


def test_bfloat16_logits_draw_the_same_tokens_on_both_backends():
    values = torch.randn(len(ROWS), VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    as_bf16 = [lambda x: torch.from_numpy(x).bfloat16(), lambda x: mx.array(x).astype(mx.bfloat16)]
    logits = values.numpy()
    tokens = [draws(s, convert, logits, range(len(ROWS)))[0] for (s, _), convert in zip(backends(), as_bf16)]
    assert tokens[0] == tokens[1]


def test_both_backends_verify_drafts_alike():
    rng = np.random.default_rng(2)
    for trial in range(40):
        draft = rng.integers(0, VOCAB, 3).tolist()
        logits = (rng.standard_normal((len(draft) + 1, VOCAB)) * 2).astype(np.float32)
        logits[np.arange(len(draft)), draft] += rng.uniform(0, 8, len(draft)).astype(np.float32)  # often kept
        params = ROWS[trial % len(ROWS)][0]
        if params.greedy:
            continue
        outs = [s.verify_draft(to(logits), params, s.make_generator(trial), draft) for s, to in backends()]
        assert outs[0] == outs[1]
        assert 1 <= len(outs[0]) <= len(draft) + 1 and outs[0][:-1] == draft[:len(outs[0]) - 1]


# --- the rule's edges ---------------------------------------------------------------------------
def test_a_nan_row_fails_when_sampled_and_gives_the_first_nan_when_greedy():
    row = np.array([[0.0, np.nan, 1.0, np.nan]], np.float32)
    with pytest.raises(ValueError, match="nothing to draw from"):
        rule.sample(row, [SamplingParams(temperature=1.0)], [rule.make_generator(0)])
    assert rule.sample(row, [SamplingParams()], [rule.make_generator(0)]).token_ids == [1]


def test_a_row_with_every_token_masked_fails_when_sampled():
    masked = BatchAdjustment.of_rows([LogitsAdjustment(allowed=np.zeros(1, np.int32))])
    with pytest.raises(ValueError, match="nothing to draw from"):
        rule.sample(np.zeros((1, 20), np.float32), [SamplingParams(temperature=1.0)], [rule.make_generator(0)], masked)


def test_filters_that_keep_everything_or_only_the_top_token():
    row = (np.random.default_rng(3).standard_normal(64) * 2).astype(np.float32)
    free = rule.weights(row, SamplingParams(temperature=0.8))
    assert np.array_equal(rule.weights(row, SamplingParams(temperature=0.8, top_k=64)), free)
    assert np.array_equal(rule.weights(row, SamplingParams(temperature=0.8, top_k=1000)), free)
    for settings in (dict(top_p=1e-12), dict(top_k=1), dict(temperature=1e-300), dict(min_p=1.0)):
        kept = np.flatnonzero(rule.weights(row, SamplingParams(**{"temperature": 1.0, **settings})))
        assert kept.tolist() == [int(row.argmax())], settings


def test_min_p_is_relative_to_the_top_probability_left_by_top_p():
    probs = np.array([0.40, 0.30, 0.15, 0.09, 0.06])
    kept = rule.weights(np.log(probs).astype(np.float32), SamplingParams(temperature=1.0, top_p=0.8, min_p=0.5))
    assert np.flatnonzero(kept).tolist() == [0, 1]  # top-p keeps 0, 1, 2; min-p drops 0.15 < 0.5 * 0.40
    assert np.allclose(kept[:2], probs[:2])


def test_a_draw_never_picks_a_zero_weight_and_follows_the_weights():
    weights = np.array([0.0, 0.25, 0.0, 0.75, 0.0, 0.0])
    generator = rule.make_generator(4)
    counts = np.bincount([rule.draw(weights, generator) for _ in range(4000)], minlength=6)
    assert counts[[0, 2, 4, 5]].sum() == 0 and abs(counts[1] - 1000) < 5 * np.sqrt(1000)
    assert rule.draw(np.array([0.0, 0.0, 2.0]), generator) == 2


def test_a_draw_survives_rounding_noise_in_near_uniform_weights():
    """A recomputed sequence (after a preemption) sees logits slightly off the first pass (prefill
    attention, not the decode kernel); over a tiny random model's almost flat 151,936 tokens the
    draw must not depend on that. An inverse CDF sums the noise of every token before the chosen
    one and kept the token for 256 of these 300 seeds."""
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(151_936) * 0.05).astype(np.float32)
    nudged = row + (rng.standard_normal(row.size) * 1e-3).astype(np.float32)
    params = SamplingParams(temperature=0.9)
    same = [rule.draw(rule.weights(row, params), rule.make_generator(seed))
            == rule.draw(rule.weights(nudged, params), rule.make_generator(seed)) for seed in range(300)]
    assert sum(same) >= 297


def test_seeds_cover_int64_and_wrap_like_torch():
    first = [rule.make_generator(-1).random() for _ in range(2)]
    assert first[0] == first[1] == rule.make_generator(2**64 - 1).random()
    assert rule.make_generator(-2**63).random() != rule.make_generator(2**63 - 1).random()


def full_sort_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Top-p the plain way: sort the whole vocabulary, keep while the mass before is below top_p."""
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    out = np.zeros_like(probs)
    out[order] = np.where(mass_before < top_p, probs[order], 0.0)
    return out


@pytest.mark.parametrize("spread", [0.5, 3.0, 12.0])  # flat to confident
@pytest.mark.parametrize("top_p", [1e-9, 0.5, 0.95, 0.999999])
def test_top_p_sorting_only_likely_tokens_equals_sorting_all(spread, top_p):
    rng = np.random.default_rng(int(spread * 10))
    for _ in range(5):
        row = (rng.standard_normal(20_000) * spread).astype(np.float32)
        free = rule.weights(row, SamplingParams(temperature=1.0))
        np.testing.assert_array_equal(rule.weights(row, SamplingParams(temperature=1.0, top_p=top_p)),
                                      full_sort_top_p(free, top_p))


def full_vocabulary_top_k(row: np.ndarray, top_k: int, temperature: float) -> np.ndarray:
    """Top-k the plain way: softmax over the whole row with every token below the k-th at -inf."""
    scaled = (row.astype(np.float64) - row.max()) / temperature
    scaled[scaled < np.sort(scaled)[-top_k]] = -np.inf
    probs = np.exp(scaled)
    return probs / probs.sum()


@pytest.mark.parametrize("top_k", [1, 2, 20, 299])
def test_top_k_on_the_kept_tokens_equals_top_k_over_the_vocabulary(top_k):
    rng = np.random.default_rng(top_k)
    for _ in range(5):
        row = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
        row[rng.integers(0, VOCAB, 10)] = row.max()  # ties at the top
        row[rng.integers(0, VOCAB, 10)] = -np.inf  # masked tokens
        got = rule.weights(row, SamplingParams(temperature=0.7, top_k=top_k))
        np.testing.assert_allclose(got, full_vocabulary_top_k(row, top_k, 0.7), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="nothing to draw from"):  # a NaN row is refused with top-k too
        rule.sample(np.array([[0.0, np.nan, 1.0]], np.float32), [SamplingParams(temperature=1.0, top_k=2)],
                    [rule.make_generator(0)])
