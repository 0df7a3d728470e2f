"""Chat completions through the real `openai` client and raw SSE, on a live SmolLM2 server.

References come from the offline API (LLM(...).chat) on the same GGUF, never from the server.
"""
from __future__ import annotations

import json

import pytest
from server_fixtures import openai_client, smollm2_model_name, smollm2_server  # noqa: F401 (fixtures)
from stream_checks import StreamCollector, parse_sse

from qwen_serve import LLM, SamplingParams

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]  # greedy: a short answer, then EOS
PARIS = [{"role": "user", "content": "Describe the city of Paris in three sentences."}]  # greedy: long prose


@pytest.fixture(scope="module")
def client(smollm2_server):
    with openai_client(smollm2_server) as c:
        yield c


@pytest.fixture(scope="module")
def offline(smollm2_path) -> LLM:
    return LLM(str(smollm2_path), kv_dtype="auto")  # the server's default: the backend's choice for this CPU


def chat(client, model, messages, **kw):
    return client.chat.completions.create(model=model, messages=messages, **kw)


def stream(client, model, messages, **kw) -> StreamCollector:
    return StreamCollector().collect(chat(client, model, messages, stream=True, **kw))


def test_health_and_models_describe_the_embedded_model(smollm2_server, client, smollm2_model_name):
    status, _, body = smollm2_server.request("GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok"
    assert "smollm2" in health["model"].lower()
    assert health["block_size"] == 16 and health["kv_blocks_total"] == 512 and health["max_batch"] == 16
    assert [m.id for m in client.models.list().data] == [smollm2_model_name] == [health["model"]]


@pytest.mark.parametrize("messages, max_tokens, finish_reason", [
    (CAPITAL, 64, "stop"),
    (PARIS, 16, "length"),
])
def test_greedy_equals_the_offline_api(client, offline, smollm2_model_name, messages, max_tokens, finish_reason):
    reference = offline.chat([messages], SamplingParams(temperature=0, max_tokens=max_tokens))[0]
    assert reference.finish_reason == finish_reason  # the case this parameter is meant to cover
    prompt_tokens = len(offline.tokenizer.encode_chat(messages))

    reply = chat(client, smollm2_model_name, messages, temperature=0, max_tokens=max_tokens)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == reference.text
    assert reply.choices[0].finish_reason == finish_reason
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (
        prompt_tokens, len(reference.token_ids), prompt_tokens + len(reference.token_ids))

    streamed = stream(client, smollm2_model_name, messages, temperature=0, max_tokens=max_tokens)
    assert streamed.text == reference.text
    assert streamed.finish_reason == finish_reason
    assert (streamed.usage.prompt_tokens, streamed.usage.completion_tokens) == (prompt_tokens, len(reference.token_ids))


def test_same_seed_same_text_streamed_or_not(client, smollm2_model_name):
    params = dict(temperature=0.9, top_p=0.95, max_tokens=20)
    first = chat(client, smollm2_model_name, PARIS, seed=1234, **params)
    streamed = stream(client, smollm2_model_name, PARIS, seed=1234, **params)
    other_seed = chat(client, smollm2_model_name, PARIS, seed=4321, **params)
    text = first.choices[0].message.content
    assert text
    assert streamed.text == text
    assert streamed.finish_reason == first.choices[0].finish_reason
    assert streamed.usage.completion_tokens == first.usage.completion_tokens
    assert other_seed.choices[0].message.content != text, "the seed had no effect on sampling"


@pytest.mark.parametrize("messages, max_tokens, finish_reason", [
    (PARIS, 6, "length"),
    (CAPITAL, 64, "stop"),
])
def test_raw_sse_wire_format(smollm2_server, offline, messages, max_tokens, finish_reason):
    status, headers, body = smollm2_server.chat({"messages": messages, "max_tokens": max_tokens, "stream": True})
    assert status == 200, body
    assert headers["content-type"].split(";")[0].strip() == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    payloads = parse_sse(body)
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    chunks = []
    for payload in payloads[:-1]:
        obj = json.loads(payload)
        assert payload in (json.dumps(obj, separators=(",", ":"), ensure_ascii=False),
                           json.dumps(obj, separators=(",", ":"))), f"not compact JSON: {payload}"
        chunks.append(obj)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and len(c["choices"]) == 1 for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}

    with_usage = [i for i, c in enumerate(chunks) if "usage" in c]
    with_finish = [i for i, c in enumerate(chunks) if c["choices"][0].get("finish_reason")]
    assert with_usage == with_finish == [len(chunks) - 1], "usage and finish_reason belong to the last chunk only"
    assert chunks[-1]["choices"][0]["finish_reason"] == finish_reason

    reference = offline.chat([messages], SamplingParams(temperature=0, max_tokens=max_tokens))[0]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == reference.text
    prompt_tokens = len(offline.tokenizer.encode_chat(messages))
    usage = dict(chunks[-1]["usage"])
    cached = usage.pop("prompt_tokens_details")["cached_tokens"]  # prefix-cache hits: whole 16-token blocks
    assert cached % 16 == 0 and 0 <= cached < prompt_tokens
    assert usage == {"prompt_tokens": prompt_tokens, "completion_tokens": len(reference.token_ids),
                     "total_tokens": prompt_tokens + len(reference.token_ids)}


@pytest.fixture(scope="module")
def greedy_paris(client, smollm2_model_name):
    """A stop-less greedy answer and the text of each of its tokens (from the logprobs bytes)."""
    reply = chat(client, smollm2_model_name, PARIS, temperature=0, max_tokens=24, logprobs=True, top_logprobs=0)
    tokens = [bytes(e.bytes).decode("utf-8") for e in reply.choices[0].logprobs.content]
    assert "".join(tokens) == reply.choices[0].message.content
    return reply.choices[0].message.content, tokens


def spanning_stop(text: str, tokens: list[str]) -> tuple[str, int, int]:
    """A stop string that starts inside one token, covers the next whole and ends inside the
    third: (stop, where the content must be cut, tokens generated when it completes)."""
    offset = 0
    for i, (a, b, c) in enumerate(zip(tokens, tokens[1:], tokens[2:])):
        if i >= 2 and len(a) >= 2 and len(b) >= 1 and len(c) >= 2:
            start = offset + len(a) // 2
            stop = a[len(a) // 2:] + b + c[:len(c) // 2]
            if text.find(stop) == start:
                return stop, start, i + 3
        offset += len(a)
    raise AssertionError(f"no three-token stop string in {tokens}")


def test_stop_string_spanning_tokens_cuts_both_paths(client, smollm2_model_name, greedy_paris):
    text, tokens = greedy_paris
    stop, cut, generated = spanning_stop(text, tokens)
    expected = text[:cut]
    kw = dict(temperature=0, max_tokens=24, stop=["never-in-this-answer", stop])

    reply = chat(client, smollm2_model_name, PARIS, **kw)
    assert reply.choices[0].message.content == expected, f"stop {stop!r}"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == generated

    streamed = stream(client, smollm2_model_name, PARIS, **kw)
    assert streamed.text == expected, f"stop {stop!r}, deltas {streamed.pieces}"
    assert streamed.finish_reason == "stop"
    assert streamed.usage.completion_tokens == generated


def test_logprobs_agree_between_stream_and_non_stream(client, smollm2_model_name):
    kw = dict(temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    reply = chat(client, smollm2_model_name, PARIS, **kw)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 12
    for entry in entries:
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 3 and top == sorted(top, reverse=True) and top[0] <= 0.0
        assert entry.logprob == top[0], "greedy picks the most likely token"
        assert entry.token == entry.top_logprobs[0].token
        assert sum(2.718281828459045 ** lp for lp in top) <= 1.0 + 1e-5
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8") == reply.choices[0].message.content

    streamed = stream(client, smollm2_model_name, PARIS, **kw)
    assert streamed.text == reply.choices[0].message.content
    assert [e.token for e in streamed.logprobs] == [e.token for e in entries]
    for got, want in zip(streamed.logprobs, entries):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
