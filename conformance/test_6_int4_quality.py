"""Check 6: int4 weights keep the model's top-5 next-token sets: > 80% agreement with float
over a set of prompts, on real weights (SmolLM2)."""
from __future__ import annotations

import pytest

from qwen_serve import SamplingParams

from .prompts import CHAT_PROMPTS
from .requirements import lacks_quantization

pytestmark = pytest.mark.conformance_check(6)
MIN_AGREEMENT = 0.80


def top5(llm, prompts) -> list[list[int]]:
    """Each prompt's five most likely next tokens, most likely first."""
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, logprobs=5))
    return [sorted(o.logprobs[0], key=o.logprobs[0].get, reverse=True)[:5] for o in outs]


def test_int4_top5_agreement(implementation, engines, registry, smollm2, figure):
    reason = lacks_quantization(registry.backend(implementation.backend), "int4")
    if reason:
        pytest.skip(reason)
    float_llm = engines.get(implementation, smollm2)
    prompts = [float_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    assert len(prompts) >= 20
    reference = top5(float_llm, prompts)
    quantized = top5(engines.get(implementation, smollm2, quant="int4"), prompts)
    # agreement of the two top-5 sets: the mean share of the five they have in common
    agreement = sum(len(set(a) & set(b)) for a, b in zip(reference, quantized)) / (5 * len(prompts))
    top1_kept = sum(a[0] in b for a, b in zip(reference, quantized)) / len(prompts)
    figure(f"{agreement:.1%} top-5 agreement ({top1_kept:.0%} float top-1 in int4 top-5) over {len(prompts)} prompts")
    assert agreement > MIN_AGREEMENT
