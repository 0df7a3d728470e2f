"""Check 6: int4 weights keep the model's top-5 next-token sets: > 80% agreement with float
over a set of prompts, on real weights (SmolLM2)."""
from __future__ import annotations

import pytest

from qwen_serve import SamplingParams

from .prompts import CHAT_PROMPTS
from .requirements import lacks_quantization

pytestmark = pytest.mark.conformance_check(6)
MIN_AGREEMENT = 0.80


def top5_sets(llm, prompts) -> list[set[int]]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, logprobs=5))
    return [set(sorted(o.logprobs[0], key=o.logprobs[0].get, reverse=True)[:5]) for o in outs]


def test_int4_top5_agreement(implementation, engines, registry, smollm2, figure):
    reason = lacks_quantization(registry.backend(implementation.backend), "int4")
    if reason:
        pytest.skip(reason)
    float_llm = engines.get(implementation, smollm2)
    prompts = [float_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    assert len(prompts) >= 20
    reference = top5_sets(float_llm, prompts)
    quantized = top5_sets(engines.get(implementation, smollm2, quant="int4"), prompts)
    agreement = sum(len(a & b) for a, b in zip(reference, quantized)) / (5 * len(prompts))
    figure(f"{agreement:.1%} top-5 agreement over {len(prompts)} prompts")
    assert agreement > MIN_AGREEMENT
