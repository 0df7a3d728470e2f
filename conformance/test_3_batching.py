"""Check 3: 8 concurrent requests finish at least 1.5x faster in aggregate than the same 8
run one at a time, through the real engine (real SmolLM2 weights, and a random Qwen3-MoE whose
experts each run once per step for all the rows routed to them)."""
from __future__ import annotations

import pytest

from qwen_serve import SamplingParams

from .harness import timed
from .implementations import skip_unservable
from .prompts import CHAT_PROMPTS
from .requirements import computes_serially

pytestmark = pytest.mark.conformance_check(3)
MIN_SPEEDUP = 1.5


@pytest.mark.parametrize("model_fixture", ["smollm2", "random_qwen3_moe", "random_qwen3_5"])
def test_eight_concurrent_requests_beat_one_at_a_time(implementation, engines, registry, request, model_fixture, figure):
    skip_unservable(registry, implementation, model_fixture)
    llm = engines.get(implementation, request.getfixturevalue(model_fixture))
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS[:8]]
    params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    sequential_s, alone = timed(lambda: [llm.generate([p], params)[0] for p in prompts])
    concurrent_s, together = timed(llm.generate, prompts, params)
    tokens = sum(len(o.token_ids) for o in together)
    assert tokens == sum(len(o.token_ids) for o in alone) == 8 * params.max_tokens
    speedup = sequential_s / concurrent_s
    measured = f"{speedup:.2f}x ({tokens / sequential_s:.1f} -> {tokens / concurrent_s:.1f} tok/s)"
    figure(f"{model_fixture}: {measured}")
    reason = computes_serially(registry.backend(implementation.backend))
    if speedup < MIN_SPEEDUP and reason:
        pytest.xfail(f"{reason}: {measured}")
    assert speedup >= MIN_SPEEDUP
