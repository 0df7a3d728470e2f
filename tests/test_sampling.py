"""The sampler's contract: fixed filter order, per-request generator seeded once."""
from __future__ import annotations

import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.torch_cpu.sampler import TorchSampler


def draw(logits, params, seed, n=1):
    sampler = TorchSampler()
    generator = sampler.make_generator(seed)
    rows = torch.as_tensor(logits, dtype=torch.float32)[None].expand(n, -1)
    return [sampler.sample(row[None], [params], [generator]).token_ids[0] for row in rows]


def test_temperature_zero_is_argmax_first_on_ties():
    logits = [0.5, 3.0, -1.0, 3.0, 2.9]
    assert draw(logits, SamplingParams(temperature=0.0, top_k=5, top_p=0.1), seed=0, n=5) == [1] * 5


def test_top_k_keeps_only_k_most_likely():
    logits = [4.0, 3.9, 3.8, 0.0, -1.0, 3.7]
    seen = set(draw(logits, SamplingParams(temperature=5.0, top_k=2), seed=1, n=300))
    assert seen == {0, 1}


def test_top_p_keeps_smallest_set_over_p_and_at_least_one():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().tolist()
    assert set(draw(logits, SamplingParams(temperature=1.0, top_p=0.75), seed=2, n=400)) == {0, 1}
    assert set(draw(logits, SamplingParams(temperature=1.0, top_p=1e-9), seed=3, n=50)) == {0}


def test_draws_follow_the_tempered_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0])
    n = 3000
    counts = torch.bincount(torch.tensor(draw(logits, SamplingParams(temperature=2.0), seed=4, n=n)), minlength=3)
    expected = torch.softmax(logits / 2.0, dim=0) * n
    assert torch.all((counts - expected).abs() < 5 * expected.sqrt())


def test_generator_is_seeded_once_per_request_not_per_token():
    # Reseeding per token would repeat the same uniform draw: a flat distribution would then
    # give the same token every time.
    tokens = draw([0.0] * 50, SamplingParams(temperature=1.0), seed=5, n=40)
    assert len(set(tokens)) > 10


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path))


def test_same_seed_same_text_different_seed_differs(llm):
    chat = [{"role": "user", "content": "Tell me a short story about a cat."}]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=32, seed=7)
    first = llm.chat([chat], params)[0]
    second = llm.chat([chat], params)[0]
    other = llm.chat([chat], SamplingParams(temperature=1.0, top_p=0.95, max_tokens=32, seed=8))[0]
    assert first.text == second.text and first.token_ids == second.token_ids
    assert other.token_ids != first.token_ids


def test_unseeded_requests_get_fresh_seeds(llm):
    chat = [{"role": "user", "content": "Name a random animal and describe it."}]
    params = SamplingParams(temperature=1.0, max_tokens=24)
    texts = {llm.chat([chat], params)[0].text for _ in range(3)}
    assert len(texts) > 1


def test_logprobs_are_the_models_top_k(llm):
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Say yes."}])
    out = llm.generate([prompt], SamplingParams(max_tokens=3, logprobs=3))[0]
    assert len(out.logprobs) == len(out.token_ids)
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and 3 <= len(entry) <= 4
        assert max(entry, key=entry.get) == token  # greedy picks the most likely
        assert all(v <= 0.0 for v in entry.values())


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"max_tokens": 0},
    {"logprobs": 21}, {"stop": [""]}, {"seed": "x"},
])
def test_invalid_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
