"""Check 1: the same seed, prompt and params give the same text, alone, beside other requests,
and through the HTTP API under concurrency; different seeds differ."""
from __future__ import annotations

import pytest

from qwen_serve import SamplingParams

from .http_client import chat, running_server
from .implementations import skip_unservable
from .prompts import CHAT_PROMPTS
from .requirements import amplifies_batch_variance

pytestmark = pytest.mark.conformance_check(1)
PARAMS = dict(temperature=0.9, top_p=0.95, top_k=50, max_tokens=24)


@pytest.mark.parametrize("model_fixture", ["smollm2", "random_qwen3_moe", "random_qwen3_5"])
def test_same_seed_same_text_different_seed_differs(implementation, engines, registry, request, model_fixture, figure):
    skip_unservable(registry, implementation, model_fixture)
    llm = engines.get(implementation, request.getfixturevalue(model_fixture))
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Tell me a story about a brave mouse."}])
    runs = [llm.generate([prompt], SamplingParams(seed=seed, **PARAMS))[0].text for seed in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({runs[0], runs[2], runs[3]}) == 3, "different seeds should give different text"
    # the same seeded request beside 7 others (batched, other seeds) gives the same text again
    others = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS[:7]]
    batch = llm.generate([prompt] + others, SamplingParams(seed=1, **PARAMS))
    assert batch[0].text == runs[0]
    figure(f"{model_fixture}: seeded text identical alone and in a batch of 8")


def test_seeded_requests_through_http_under_concurrency(implementation, engines, smollm2, figure):
    from concurrent.futures import ThreadPoolExecutor

    message = [{"role": "user", "content": "Describe a sunset over the ocean."}]
    body = dict(messages=message, seed=7, **PARAMS)
    with running_server(implementation, smollm2) as server:
        alone = chat(server, body)
        with ThreadPoolExecutor(max_workers=6) as pool:
            crowd = [pool.submit(chat, server, dict(messages=[{"role": "user", "content": p}], seed=i, **PARAMS))
                     for i, p in enumerate(CHAT_PROMPTS[:4])]
            again = [pool.submit(chat, server, body) for _ in range(2)]
            results = [f.result() for f in again]
            [f.result() for f in crowd]
        other_seed = chat(server, dict(body, seed=8))
    assert other_seed != alone
    identical = 1 + sum(r == alone for r in results)
    figure(f"HTTP: {identical}/3 identical under concurrency")
    if identical < 3 and (reason := amplifies_batch_variance(engines.get(implementation, smollm2).engine.cache)):
        pytest.xfail(f"{reason}: {identical}/3 identical")
    assert identical == 3
