"""Check 4: a second request sharing a ~200-token system prompt prefills at least 13 blocks
fewer and has a lower TTFT than the first, on SmolLM2 and on a hybrid Qwen3.5 (whose hit needs
the linear-attention state at a block boundary: a snapshot)."""
from __future__ import annotations

import pytest

from qwen_serve import SamplingParams

from .harness import run_alone
from .implementations import skip_unservable
from .prompts import SYSTEM_PROMPT
from .requirements import lacks_prefix_sharing

pytestmark = pytest.mark.conformance_check(4)


@pytest.mark.parametrize("model_fixture", ["smollm2", "random_qwen3_5_small"])
def test_shared_system_prompt_is_served_from_cache(implementation, engines, registry, request, model_fixture, figure):
    skip_unservable(registry, implementation, model_fixture)
    llm = engines.get(implementation, request.getfixturevalue(model_fixture), kv_blocks=256)
    reason = lacks_prefix_sharing(llm.parts.cache)
    if reason:
        pytest.skip(reason)
    block = llm.parts.engine_config.block_size
    ask = lambda q: llm.tokenizer.encode_chat([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}])
    first_prompt, second_prompt = ask("When do you open on Saturday?"), ask("How much does colour printing cost?")
    shared = next(i for i, (a, b) in enumerate(zip(first_prompt, second_prompt)) if a != b)
    assert 190 <= shared and shared // block >= 13, f"shared prefix is only {shared} tokens"
    params = SamplingParams(max_tokens=1)
    first = run_alone(llm, first_prompt, params)
    second = run_alone(llm, second_prompt, params)
    cached_first = len(first_prompt) - first.prefill_tokens
    cached_second = len(second_prompt) - second.prefill_tokens
    saved_blocks = (cached_second - cached_first) // block
    figure(f"{model_fixture}: {saved_blocks} blocks saved, TTFT {first.ttft_s * 1000:.0f} -> {second.ttft_s * 1000:.0f} ms")
    assert cached_first == 0, "the first request must miss (run the check on a fresh engine)"
    assert saved_blocks >= 13
    assert second.ttft_s < first.ttft_s
