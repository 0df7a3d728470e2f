"""Legacy /v1/completions through the real `openai` client, and /tokenize and /detokenize, on
the shared SmolLM2 server. References come from the offline API on the same GGUF."""
from __future__ import annotations

import json

import pytest
from chat_stream import JoinedStream
from server_fixtures import openai_client, smollm2_model_name, smollm2_server  # noqa: F401 (fixtures)

from qwen_serve import LLM, SamplingParams

PROMPT = "The three primary colors are"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def client(smollm2_server):
    with openai_client(smollm2_server) as c:
        yield c


@pytest.fixture(scope="module")
def offline(smollm2_path) -> LLM:
    return LLM(str(smollm2_path), kv_dtype="auto")  # the server's default: the backend's choice for this CPU


@pytest.fixture(scope="module")
def reference(offline):
    """Greedy continuations of PROMPT (as text) and of a token-id prompt, with top-2 logprobs,
    each run alone as the server runs a single request: rows batched otherwise take other
    kernel paths, and a bf16 KV cache can round their last-bit differences a whole bf16 step apart."""
    ids = offline.tokenizer.encode("Once upon a time")
    params = SamplingParams(max_tokens=MAX_TOKENS, logprobs=2)
    [of_text], [of_ids] = offline.generate([PROMPT], params), offline.generate([ids], params)
    return {"of_text": of_text, "of_ids": of_ids, "token_ids": ids}


def test_completion_of_a_text_prompt_and_of_token_ids(client, smollm2_model_name, reference, offline):
    reply = client.completions.create(model=smollm2_model_name, prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == reference["of_text"].text and reply.choices[0].index == 0
    assert reply.choices[0].finish_reason == reference["of_text"].finish_reason
    assert reply.usage.prompt_tokens == len(offline.tokenizer.encode(PROMPT))
    assert reply.usage.completion_tokens == len(reference["of_text"].token_ids)

    both = client.completions.create(model=smollm2_model_name, prompt=[PROMPT, "Once upon a time"],
                                     max_tokens=MAX_TOKENS)
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [reference["of_text"].text, reference["of_ids"].text]
    by_ids = client.completions.create(model=smollm2_model_name, prompt=reference["token_ids"], max_tokens=MAX_TOKENS)
    assert by_ids.choices[0].text == reference["of_ids"].text
    assert by_ids.usage.prompt_tokens == len(reference["token_ids"])


def test_legacy_logprobs(client, smollm2_model_name, reference):
    reply = client.completions.create(model=smollm2_model_name, prompt=reference["token_ids"],
                                      max_tokens=MAX_TOKENS, logprobs=2)
    logprobs = reply.choices[0].logprobs
    expected = reference["of_ids"]
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(expected.token_ids) == MAX_TOKENS
    assert "".join(logprobs.tokens) == reply.choices[0].text
    for token, logprob, top, want in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs,
                                         expected.logprobs):
        assert logprob == pytest.approx(max(want.values()), abs=1e-4), "greedy takes the most likely token"
        assert len(top) == 2 and top[token] == logprob and all(v <= logprob for v in top.values())
    offsets = logprobs.text_offset
    assert offsets[0] == 0 and offsets == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(offsets))]


@pytest.mark.parametrize("include_usage", [False, True])
def test_streamed_completion_equals_the_json_one(client, smollm2_model_name, reference, include_usage):
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = client.completions.create(model=smollm2_model_name, prompt=[PROMPT, "Once upon a time"],
                                       max_tokens=MAX_TOKENS, stream=True, **options)
    joined = JoinedStream(stream, include_usage=include_usage)
    assert {i: "".join(c.text) for i, c in joined.choices.items()} == {
        0: reference["of_text"].text, 1: reference["of_ids"].text}
    assert joined.choices[0].finish_reason == reference["of_text"].finish_reason
    assert joined.usage.completion_tokens == len(reference["of_text"].token_ids) + len(reference["of_ids"].token_ids)


def test_tokenize_and_detokenize_round_trip(smollm2_server, offline):
    text = "Hello, world! Ünïcödé 🙂"
    status, _, raw = smollm2_server.request("POST", "/tokenize", {"prompt": text})
    assert status == 200, raw
    body = json.loads(raw)
    assert body["tokens"] == offline.tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == offline.engine.max_seq_len
    status, _, raw = smollm2_server.request("POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and json.loads(raw) == {"prompt": text}


def test_tokenize_messages_renders_the_chat_template(smollm2_server, offline):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    status, _, raw = smollm2_server.request("POST", "/tokenize", {"messages": messages})
    assert status == 200, raw
    body = json.loads(raw)
    assert body["tokens"] == offline.tokenizer.encode_chat(messages)
    status, _, raw = smollm2_server.request("POST", "/tokenize", {"messages": messages, "add_generation_prompt": False,
                                                                  "return_token_strs": True})
    without = json.loads(raw)
    assert without["tokens"] == offline.tokenizer.encode_chat(messages, add_generation_prompt=False)
    assert len(without["token_strs"]) == without["count"] < body["count"]
