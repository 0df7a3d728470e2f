"""Check 6: int4 weights keep the model's top-5 next-token sets: > 80% agreement with float
over a set of prompts, on real weights (SmolLM2). How it is measured: conformance.agreement."""
from __future__ import annotations

import pytest

from .agreement import top5_agreement
from .prompts import CHAT_PROMPTS
from .requirements import lacks_quantization

pytestmark = pytest.mark.conformance_check(6)
MIN_AGREEMENT = 0.80


def test_int4_top5_agreement(implementation, engines, registry, smollm2, figure):
    reason = lacks_quantization(registry.backend(implementation.backend), "int4")
    if reason:
        pytest.skip(reason)
    float_llm = engines.get(implementation, smollm2)
    prompts = [float_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    assert len(prompts) >= 20
    result = top5_agreement(float_llm, engines.get(implementation, smollm2, quant="int4"), prompts)
    figure(result.describe(len(prompts)))
    assert result.overall > MIN_AGREEMENT
