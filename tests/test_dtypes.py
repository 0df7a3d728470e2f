"""bfloat16 halves weight and KV memory; compute stays float32 (bf16 matmul is ~100x slower on
this kind of CPU), so outputs stay close to float32."""
from __future__ import annotations

import math

from qwen_serve import LLM, SamplingParams


def test_bfloat16_halves_memory_and_stays_close_to_float32(smollm2_path):
    f32 = LLM(str(smollm2_path))
    bf16 = LLM(str(smollm2_path), dtype="bfloat16")
    assert abs(bf16.parts.executor.weight_bytes() / f32.parts.executor.weight_bytes() - 0.5) < 0.01
    prompt = f32.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    params = SamplingParams(max_tokens=8, logprobs=5)
    a = f32.generate([prompt], params)[0]
    b = bf16.generate([prompt], params)[0]
    assert "Paris" in b.text
    first_a, first_b = a.logprobs[0], b.logprobs[0]
    assert max(first_a, key=first_a.get) == max(first_b, key=first_b.get)
    shared = set(first_a) & set(first_b)
    assert len(shared) >= 4
    assert all(math.isclose(first_a[t], first_b[t], abs_tol=0.1) for t in shared)
    storage = bf16.parts.cache.storage
    assert storage.keys[0].element_size() == 2
