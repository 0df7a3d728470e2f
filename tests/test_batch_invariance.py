"""Batch invariance on the torch backend: a request's log-probabilities are bit-identical whether
it runs alone or beside seven other prompts, so a seeded draw gives the same text either way.
Where the AVX-512 or AVX2 kernels run, every float32 matmul of the default model goes through one
whose rows do not depend on each other (backends/torch_cpu/linear.py says what oneDNN did instead)."""
from __future__ import annotations

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.torch_cpu.native import load_kernels

PROMPTS = ["Write a short poem about a lighthouse.", "What is the capital of France?",
           "List three prime numbers.", "Who wrote Hamlet?", "How do I reverse a list in Python?",
           "Describe a glacier in one sentence.", "Name a famous violinist.", "Why is the sky blue?"]
STEPS = 24


@pytest.fixture(scope="module", params=["paged", "audited-paged"])
def llm(smollm2_path, request):
    """The built-in paged cache (attended in place by the paged kernel), and a cache the backend
    does not know (examples/audited-kv-cache: keys gathered, one attention per sequence)."""
    kernels = load_kernels()
    if kernels is None:
        pytest.skip("float32 matmuls are batch-invariant where the C++ kernels run; oneDNN's are not")
    return LLM(str(smollm2_path), backend="torch", kv_cache=request.param)


def chat_ids(llm: LLM, prompt: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": prompt}])


def companions_params(params: SamplingParams) -> list[SamplingParams]:
    """The other seven stop one after another (steps of 8, 7, ... 1 rows, rounded or not), and
    draw from seeds of their own."""
    return [SamplingParams(**{**vars(params), "max_tokens": 3 * i, "seed": 1000 + i}) for i in range(1, 8)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("which", [0, 5])
def test_logprobs_alone_equal_logprobs_in_a_batch_of_eight(llm, temperature, which):
    params = SamplingParams(temperature=temperature, seed=7, max_tokens=STEPS, ignore_eos=True, logprobs=20)
    prompts = [chat_ids(llm, p) for p in PROMPTS]
    alone = llm.generate([prompts[which]], params)[0]
    others = companions_params(params)
    batch_params = others[:which] + [params] + others[which:]
    batched = llm.generate(prompts, batch_params)[which]
    assert batched.token_ids == alone.token_ids
    for step, (a, b) in enumerate(zip(alone.logprobs, batched.logprobs)):
        assert a == b, f"step {step}: the log-probabilities differ in a batch of eight"
