"""Check 2: greedy output equals transformers token for token, on both KV caches."""
from __future__ import annotations

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.reference import hf_greedy

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three prime numbers."}],
    [{"role": "user", "content": "Explain photosynthesis to a child."}],
]
LONG_TEXT = " ".join(
    f"Item {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} lantern hangs above door number {i * 7}."
    for i in range(30)
)
CHUNK = 128  # the long prompt (~400 tokens) spans several prefill chunks


@pytest.fixture(scope="module")
def smollm2_prompts(smollm2_path):
    llm = LLM(str(smollm2_path))
    chats = CHATS + [[{"role": "user", "content": "Summarize this list:\n" + LONG_TEXT}]]
    prompts = [llm.tokenizer.encode_chat(c) for c in chats]
    assert max(len(p) for p in prompts) > 2 * CHUNK
    eos = llm.config.eos_token_ids
    expected = [hf_greedy(smollm2_path, p, 40, eos) for p in prompts]
    return prompts, expected


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
def test_smollm2_greedy_matches_transformers(smollm2_path, smollm2_prompts, kv_cache):
    prompts, expected = smollm2_prompts
    llm = LLM(str(smollm2_path), kv_cache=kv_cache, chunk_size=CHUNK)
    outs = llm.generate(prompts, SamplingParams(max_tokens=40))
    for out, ref in zip(outs, expected):
        assert out.token_ids == ref
    assert "Paris" in outs[0].text


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
@pytest.mark.parametrize("checkpoint", ["qwen3_tiny", "qwen3_untied"])
def test_random_qwen3_greedy_matches_transformers(request, checkpoint, kv_cache):
    path = request.getfixturevalue(checkpoint)
    llm = LLM(str(path), kv_cache=kv_cache, chunk_size=64)
    prompts = [
        llm.tokenizer.encode("Hello, world!"),
        llm.tokenizer.encode_chat([{"role": "user", "content": "hi there"}]),
        llm.tokenizer.encode(LONG_TEXT[:700]),  # > one chunk of 64
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(path, prompt, 32)
        assert out.finish_reason == "length"
    assert len(set(outs[0].token_ids)) > 4, "random model should produce varied tokens"


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
def test_qwen3_06b_geometry_matches_transformers(qwen3_06b, kv_cache):
    llm = LLM(str(qwen3_06b), kv_cache=kv_cache, kv_blocks=64)
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Tell me about the moon."}])
    out = llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(qwen3_06b, prompt, 4)
