"""Concurrent streams and cancellation against live servers.

Throughput is printed, never asserted (wall-clock on a shared 2-core box is noise); what is
asserted is that every request completes with the text it gets when it runs alone, and that a
client going away gives its KV blocks back at once.
"""
from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
from server_fixtures import own_server, smollm2_model_name, smollm2_server  # noqa: F401 (fixtures)
from stream_checks import StreamCollector

TOPICS = ["a lighthouse", "a violin", "the moon", "a bakery", "a glacier", "a robot", "a garden", "a train"]
LONG_MAX_TOKENS = 3000  # far more than can be generated before the test disconnects


async def one_stream(client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int) -> StreamCollector:
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"Write a short poem about {TOPICS[i]}."}],
        temperature=0.8, seed=100 + i, max_tokens=max_tokens, stream=True)
    return await StreamCollector().acollect(stream)


async def concurrent_then_sequential(base_url: str, model: str, max_tokens: int):
    """The concurrent round goes first, so prefix-cache hits favour the one-after-another round
    and the printed ratio errs low."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=300) as client:
        await one_stream(client, model, 0, 2)  # warm-up, not timed
        start = time.monotonic()
        together = await asyncio.gather(*(one_stream(client, model, i, max_tokens) for i in range(len(TOPICS))))
        concurrent_s = time.monotonic() - start
        start = time.monotonic()
        alone = [await one_stream(client, model, i, max_tokens) for i in range(len(TOPICS))]
        sequential_s = time.monotonic() - start
    return together, concurrent_s, alone, sequential_s


def test_eight_concurrent_streams_complete_with_their_solo_text(smollm2_server, smollm2_model_name, capsys):
    max_tokens = 10
    together, concurrent_s, alone, sequential_s = asyncio.run(
        concurrent_then_sequential(smollm2_server.base_url, smollm2_model_name, max_tokens))
    for i, (solo, batched) in enumerate(zip(alone, together)):
        assert batched.finish_reason in ("stop", "length") and batched.usage.completion_tokens >= 1
        assert batched.text == solo.text, f"request {i} changed its text when batched with others"
        assert batched.usage.completion_tokens == solo.usage.completion_tokens
    tokens = sum(s.usage.completion_tokens for s in alone)
    with capsys.disabled():
        print(f"\n8 streams x {max_tokens} tokens max ({tokens} tokens): one after another {sequential_s:.2f} s "
              f"({tokens / sequential_s:.1f} tok/s), concurrently {concurrent_s:.2f} s "
              f"({tokens / concurrent_s:.1f} tok/s): throughput ratio {sequential_s / concurrent_s:.2f}x")
    smollm2_server.wait_until_idle()


# --- cancellation (random Qwen3: only the mechanics matter) ---------------------------------

@pytest.fixture(scope="module")
def tiny_server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny)])


def long_request(stream: bool) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Count forever."}],
                       "max_tokens": LONG_MAX_TOKENS, "stream": stream}).encode()


def wait_for(server, condition, what: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        m = server.metrics()
        if condition(m):
            return m
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}: {m}"
        time.sleep(0.05)


def test_disconnect_mid_stream_returns_blocks(tiny_server):
    baseline = tiny_server.wait_until_idle()
    conn = tiny_server.connection()
    conn.request("POST", "/v1/chat/completions", body=long_request(stream=True),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    content_events = 0
    while content_events < 5:
        line = response.readline()
        assert line, "stream ended before the test disconnected"
        content_events += line.startswith(b"data: ") and b'"content"' in line
    wait_for(tiny_server, lambda m: m["requests_active"] == 1 and m["kv_blocks_used"] > m["kv_blocks_cached"],
                    "the streaming request to hold blocks")
    response.close()
    conn.close()

    after = tiny_server.wait_until_idle(timeout_s=5.0)
    assert after["kv_blocks_used"] == after["kv_blocks_cached"] <= after["kv_blocks_total"]
    generated = after["decode_tokens_total"] - baseline["decode_tokens_total"]
    assert generated < LONG_MAX_TOKENS - 100, f"{generated} tokens decoded: the request was not cancelled"
    tiny_server.assert_still_serving()
    tiny_server.wait_until_idle()


def test_disconnect_while_waiting_for_a_non_stream_reply(tiny_server):
    baseline = tiny_server.wait_until_idle()
    conn = tiny_server.connection()
    conn.request("POST", "/v1/chat/completions", body=long_request(stream=False),
                 headers={"Content-Type": "application/json"})
    wait_for(tiny_server, lambda m: m["requests_active"] == 1
             and m["decode_tokens_total"] >= baseline["decode_tokens_total"] + 5, "the request to be decoding")
    conn.close()  # without reading the reply

    after = tiny_server.wait_until_idle(timeout_s=5.0)
    generated = after["decode_tokens_total"] - baseline["decode_tokens_total"]
    assert generated < LONG_MAX_TOKENS - 100, f"{generated} tokens decoded: the request was not cancelled"
    tiny_server.assert_still_serving()
    tiny_server.wait_until_idle()
