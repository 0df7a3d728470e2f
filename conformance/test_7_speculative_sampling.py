"""Check 7: with sampling, speculative decoding emits tokens distributed exactly as
normal decoding. A chi-square test of the first 4 tokens of 4,000 seeded requests on a
4-token random model against the exact joint distribution (speculation.py), at a false-alarm
rate of 1e-3."""
from __future__ import annotations

import pytest

from . import speculation
from .implementations import probe_cache
from .requirements import cannot_speculate

pytestmark = pytest.mark.conformance_check(7)


def test_sampled_speculation_keeps_the_distribution(implementation, engines, registry, speculation_qwen3, figure):
    cache = probe_cache(registry, implementation.backend, implementation.kv_cache)
    reason = cannot_speculate(cache, registry.backend(implementation.backend).create_sampler())
    if reason:
        pytest.skip(reason)
    llm = engines.get(implementation, speculation_qwen3, speculative="ngram",
                      num_speculative_tokens=speculation.SPECULATIVE_TOKENS)
    sampled = speculation.sample_joint(llm)
    statistic, df, p_value = speculation.chi_square(sampled.counts, speculation.exact_joint(speculation_qwen3))
    rate = sampled.accepted / max(sampled.drafts, 1)
    figure(f"chi2 {statistic:.0f} (df {df}), p = {p_value:.2g}; {sampled.drafts} drafts, {rate:.0%} kept")
    assert 0 < sampled.accepted < sampled.drafts, "drafts must be both kept and rejected for the check to mean anything"
    assert p_value > speculation.ALPHA, (
        f"emitted tokens are not distributed as normal decoding: chi2 {statistic:.1f} on {df} df, p = {p_value:.2g}")
