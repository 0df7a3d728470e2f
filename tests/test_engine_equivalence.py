"""The engine's shortcuts must not change greedy output: KV cache vs full recompute, chunked
vs whole prefill, prefix-cache hit vs miss, batch vs one at a time, preemption vs none."""
from __future__ import annotations

import pytest

from qwen_serve import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "Once upon a time",
    "Paris, Berlin, Madrid, Rome, Lisbon, Vienna, Prague, Warsaw, Dublin, Oslo",
    "SELECT name FROM users WHERE age > 30 ORDER BY name;",
    "Il était une fois une princesse qui vivait dans un château.",
]


@pytest.fixture(scope="module")
def tiny(qwen3_tiny):
    return str(qwen3_tiny)


@pytest.fixture(scope="module")
def prompts(tiny):
    llm = LLM(tiny)
    return [llm.tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def batched_reference(tiny, prompts):
    return [o.token_ids for o in LLM(tiny).generate(prompts, GREEDY)]


def test_kv_cache_equals_full_recompute(tiny, prompts, batched_reference):
    llm = LLM(tiny, prefix_cache=False)
    for prompt, expected in zip(prompts[:3], batched_reference):
        tokens = list(prompt)
        for _ in range(GREEDY.max_tokens):  # every token from a fresh forward over everything
            tokens += llm.generate([tokens], SamplingParams(max_tokens=1, ignore_eos=True))[0].token_ids
        assert tokens[len(prompt):] == expected
    assert llm.parts.cache.usage().used == 0


def test_chunked_prefill_equals_whole_prefill(tiny, prompts, batched_reference):
    chunked = LLM(tiny, chunk_size=7, step_budget=16).generate(prompts, GREEDY)
    assert [o.token_ids for o in chunked] == batched_reference


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
def test_batch_of_8_equals_one_at_a_time(tiny, prompts, batched_reference, kv_cache):
    llm = LLM(tiny, kv_cache=kv_cache)
    alone = [llm.generate([p], GREEDY)[0].token_ids for p in prompts]
    assert alone == batched_reference
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == batched_reference


def test_prefix_cache_hit_equals_miss(tiny):
    llm = LLM(tiny)
    system = llm.tokenizer.encode("You are a helpful assistant who answers briefly. " * 8)
    first = llm.generate([system + llm.tokenizer.encode(" Q: one?")], GREEDY)[0]
    hits_before = llm.parts.cache.usage().prefix_hit_blocks
    second_prompt = system + llm.tokenizer.encode(" Q: two?")
    second = llm.generate([second_prompt], GREEDY)[0]
    hit_blocks = llm.parts.cache.usage().prefix_hit_blocks - hits_before
    assert hit_blocks >= len(system) // 16 - 1 > 0
    miss = LLM(tiny, prefix_cache=False).generate([second_prompt], GREEDY)[0]
    assert second.token_ids == miss.token_ids
    assert first.token_ids  # both ran to completion
    # an identical prompt reuses everything but the last token, and still matches
    again = llm.generate([second_prompt], GREEDY)[0]
    assert again.token_ids == miss.token_ids


def test_preemption_recomputes_without_changing_output(tiny, prompts, batched_reference):
    # 8 prompts of up to ~60 tokens + 24 new ones cannot all fit in 20 blocks of 16 at once.
    llm = LLM(tiny, kv_blocks=20, prefix_cache=False)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == batched_reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.parts.cache.usage().used == 0


def test_seeded_sampling_is_batch_invariant(tiny, prompts):
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    llm = LLM(tiny)
    alone = llm.generate([prompts[0]], params)[0].token_ids
    together = llm.generate(prompts, params)[0].token_ids  # same seed, other requests beside it
    assert alone == together
