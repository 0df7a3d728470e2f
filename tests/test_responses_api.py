"""OpenAI's Responses API end to end, through the real `openai` SDK.

A scripted server (a random Qwen3 checkpoint with Qwen3's real chat template; the seed chooses a
known reply, tests/scripted_backend.py) checks the translation both ways: reasoning, text, a
function-call round trip, reasoning carried back as encrypted_content, the stream's final
response equal to the non-streamed one, the raw event stream's numbering, the store
(previous_response_id reusing the prefix cache, GET, DELETE, store: false) and bad input. The
embedded model's server checks what needs real sampling: json_schema output under the grammar.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import tokenizers
from scripted_backend import write_scripts
from server_fixtures import openai_client, scripted_server, smollm2_server  # noqa: F401
from test_server_chat_features import WEATHER_PARIS, spell
from test_structured_output import WEATHER

from qwen_serve.responses.store import ResponseStore

THINKING = "\nThe user asks for the capital of France.\n"
SCRIPTS = {
    "think then answer": ["<think>", THINKING, "</think>", "\n\n", "The capital is Paris."],
    "tool call": ["<think>", "\nI need the weather tool.\n", "</think>", "\n\n",
                  "<tool_call>", WEATHER_PARIS, "</tool_call>"],
    "plain": ["It is sunny in Paris."],
    "json that breaks off": ['{"city": "', "Paris", '"', " and then some words"],
}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "strict": True}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = "gpt-5-codex"  # any name is served: agent clients send their user's choice
INSTRUCTIONS = ("You are a careful assistant who answers questions about the weather and about geography, "
                "briefly and politely, in English, and who uses the tools offered when they help.")


@pytest.fixture(scope="module")
def tokenizer(qwen3_tiny) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))


@pytest.fixture(scope="module")
def seeds(tokenizer, tmp_path_factory) -> dict[str, int]:
    return write_scripts({name: spell(tokenizer, pieces) for name, pieces in SCRIPTS.items()},
                         tmp_path_factory.mktemp("scripts"))


@pytest.fixture(scope="module")
def server(qwen3_tiny, seeds):
    yield from scripted_server(qwen3_tiny, seeds)


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


def plain(response, exclude: set[str] = frozenset()) -> dict:
    """A response as a dict, but for what the SDK's stream adds (None as each text part's
    ``parsed`` and each call's ``parsed_arguments``)."""
    body = response.model_dump(exclude=set(exclude))
    for item in body["output"]:
        item.pop("parsed_arguments", None)
        for part in item.get("content") or ():
            part.pop("parsed", None)
    return body


def without_ids(response) -> dict:
    """A response but for what is new each time: its ids, its creation time and its usage."""
    body = plain(response, {"id", "created_at", "usage"})
    for item in body["output"]:
        item.pop("id", None)
        item.pop("call_id", None)
    return body


def both_ways(client: openai.OpenAI, **fields):
    """The response, created and streamed (accumulated by the SDK), after checking they agree."""
    created = client.responses.create(model=MODEL, **fields)
    with client.responses.stream(model=MODEL, **fields) as stream:
        streamed = stream.get_final_response()
    assert streamed.id != created.id and streamed.id.startswith("resp_")
    assert without_ids(streamed) == without_ids(created)
    assert streamed.usage.output_tokens == created.usage.output_tokens
    assert streamed.usage.input_tokens == created.usage.input_tokens
    return created


def test_reasoning_then_text(client, seeds, tokenizer):
    response = both_ways(client, input="What is the capital of France?", reasoning={"effort": "high"},
                         extra_body={"seed": seeds["think then answer"]})
    assert response.model == MODEL and response.object == "response" and response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning, message = response.output
    assert reasoning.id.startswith("rs_") and message.id.startswith("msg_")
    assert [part.text for part in reasoning.content] == ["The user asks for the capital of France."]
    assert reasoning.encrypted_content is None  # only when include asks for it
    assert response.output_text == "The capital is Paris."
    through_think_end = 2 + len(tokenizer.encode(THINKING, add_special_tokens=False).ids)
    usage = response.usage
    assert usage.output_tokens_details.reasoning_tokens == through_think_end
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_function_call_round_trip(client, server, seeds):
    include = ["reasoning.encrypted_content"]
    first = both_ways(client, input=ASK, tools=[WEATHER_TOOL, {"type": "web_search"}], store=False, include=include,
                      extra_body={"seed": seeds["tool call"]})
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    reasoning, call = first.output
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
    assert reasoning.encrypted_content and first.tools[0].name == "get_weather" and len(first.tools) == 1

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}
    conversation = ASK + [item.model_dump(exclude_none=True) for item in first.output] + [result]
    answer = both_ways(client, input=conversation, tools=[WEATHER_TOOL], extra_body={"seed": seeds["plain"]})
    assert [item.type for item in answer.output] == ["message"] and answer.output_text == "It is sunny in Paris."

    # The conversation renders as the same chat does in OpenAI's chat shape ...
    chat = ASK + [{"role": "assistant", "content": "", "reasoning_content": reasoning.content[0].text,
                   "tool_calls": [{"id": call.call_id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees, sunny"}]
    tools = [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}]
    status, _, body = server.request("POST", "/tokenize", {"messages": chat, "tools": tools})
    assert status == 200, body
    assert answer.usage.input_tokens == json.loads(body)["count"]

    # ... and the reasoning comes back from encrypted_content alone (Codex sends it so), not from nowhere.
    def input_tokens(reasoning_item: dict) -> int:
        items = ASK + [reasoning_item, call.model_dump(exclude_none=True), result]
        return client.responses.create(model=MODEL, input=items, tools=[WEATHER_TOOL], store=False,
                                       extra_body={"seed": seeds["plain"]}).usage.input_tokens

    sealed = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    assert input_tokens(sealed) == answer.usage.input_tokens
    assert input_tokens({**sealed, "encrypted_content": "someone else's"}) < answer.usage.input_tokens


def test_raw_stream_is_numbered_and_named(server, seeds):
    status, headers, body = server.request("POST", "/v1/responses", {
        "model": MODEL, "input": "Hello", "stream": True, "seed": seeds["think then answer"]})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n") for block in body.decode().strip().split("\n\n") if not block.startswith(":")]
    assert all(len(lines) == 2 and lines[0].startswith("event: ") for lines in events), events
    bodies = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert [lines[0].removeprefix("event: ") for lines in events] == [b["type"] for b in bodies]
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    kinds = [b["type"] for b in bodies]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == "response.completed" and b"[DONE]" not in body
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds


def test_previous_response_id_continues_from_the_prefix_cache(client, seeds):
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="What is the capital of France?",
                                    extra_body={"seed": seeds["think then answer"]})
    second = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="And the weather there?",
                                     previous_response_id=first.id, extra_body={"seed": seeds["plain"]})
    assert second.previous_response_id == first.id and second.output_text == "It is sunny in Paris."
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens // 2
    assert second.usage.input_tokens_details.cached_tokens > 0
    with client.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input="And tomorrow?",
                                 previous_response_id=second.id, extra_body={"seed": seeds["plain"]}) as stream:
        third = stream.get_final_response()
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens_details.cached_tokens
    assert plain(client.responses.retrieve(third.id)) == plain(third)  # stored before the stream ended


def test_unknown_previous_response_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_nothing")
    assert caught.value.body["param"] == "previous_response_id"


def test_an_id_that_utf8_cannot_encode_is_still_a_404(server):
    """A lone surrogate (valid JSON escape, no UTF-8 form) repeated in the error: escaped, not a 500."""
    status, _, body = server.request("POST", "/v1/responses",
                                     b'{"input": "hi", "previous_response_id": "\\ud843"}')
    assert status == 404, body
    assert json.loads(body)["error"]["param"] == "previous_response_id"


def test_get_and_delete(client, server, seeds):
    created = client.responses.create(model=MODEL, input="Hello", extra_body={"seed": seeds["plain"]})
    assert client.responses.retrieve(created.id).model_dump() == created.model_dump()
    status, _, body = server.request("DELETE", f"/v1/responses/{created.id}")
    assert (status, json.loads(body)) == (200, {"id": created.id, "object": "response", "deleted": True})
    for again in (lambda: client.responses.retrieve(created.id), lambda: client.responses.delete(created.id)):
        with pytest.raises(openai.NotFoundError):
            again()


def test_store_false_is_not_kept(client, seeds):
    created = client.responses.create(model=MODEL, input="Hello", store=False, extra_body={"seed": seeds["plain"]})
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="More", previous_response_id=created.id)


def test_max_output_tokens_makes_it_incomplete(client, server, seeds):
    response = client.responses.create(model=MODEL, input="Hello", max_output_tokens=3,
                                       extra_body={"seed": seeds["plain"]})
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.output[0].status == "incomplete"
    status, _, body = server.request("POST", "/v1/responses", {
        "model": MODEL, "input": "Hello", "max_output_tokens": 3, "stream": True, "seed": seeds["plain"]})
    last = json.loads(body.decode().strip().split("\n\n")[-1].split("\n")[1].removeprefix("data: "))
    assert last["type"] == "response.incomplete"
    assert without_ids(openai.types.responses.Response.model_validate(last["response"])) == without_ids(response)


def test_what_codex_sends_that_is_not_used_is_accepted(client, seeds):
    response = client.responses.create(
        model=MODEL, instructions=INSTRUCTIONS, input=[{"type": "message", "role": "developer",
                                                        "content": [{"type": "input_text", "text": "Be brief."}]},
                                                       {"type": "message", "role": "user",
                                                        "content": [{"type": "input_text", "text": "Hi"}]}],
        tools=[WEATHER_TOOL, {"type": "custom", "name": "apply_patch"}], tool_choice="auto",
        parallel_tool_calls=False, store=False, include=["reasoning.encrypted_content"], prompt_cache_key="abc",
        reasoning={"effort": "medium", "summary": "auto"}, text={"verbosity": "low"},
        extra_body={"seed": seeds["plain"], "client_metadata": {"x": "y"}})
    assert response.output_text == "It is sunny in Paris." and response.parallel_tool_calls is False


@pytest.mark.parametrize("fields, param", [
    ({}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[0].type"),
    ({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": [{"type": {"not": "a string"}}]}, "input[0].type"),  # the fuzz found a 500 here
])
def test_bad_requests_are_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/responses", body={"model": MODEL, **fields}, cast_to=object)
    assert caught.value.body["param"] == param, caught.value.body


# --- real sampling on the embedded model -----------------------------------------------------
def test_json_schema_output_is_valid(smollm2_server):  # noqa: F811
    with openai_client(smollm2_server) as sampled:
        response = sampled.responses.create(
            model=MODEL, input="Give me the weather in Paris as JSON.", max_output_tokens=96, temperature=0.8,
            text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}},
            extra_body={"seed": 3})
    assert response.status == "completed", response
    jsonschema.validate(json.loads(response.output_text), WEATHER)


# --- the store ---------------------------------------------------------------------------------
def stored(response_id: str, text: str) -> tuple[dict, list[dict]]:
    return {"id": response_id, "object": "response"}, [{"role": "user", "content": text}]


def test_the_store_drops_the_least_recently_used_past_its_bytes():
    one_size = len(json.dumps(list(stored("resp_0", "x" * 100))).encode())
    store = ResponseStore(3 * one_size)
    for i in range(3):
        store.put(*stored(f"resp_{i}", "x" * 100))
    assert store.get("resp_0") is not None  # now the most recently used
    store.put(*stored("resp_3", "x" * 100))
    assert [store.get(f"resp_{i}") is not None for i in range(4)] == [True, False, True, True]
    assert store.used_bytes == 3 * one_size
    store.put(*stored("resp_big", "x" * 4 * one_size))  # larger than the whole store: not kept, nothing evicted
    assert store.get("resp_big") is None and len(store) == 3
    assert store.delete("resp_3") and not store.delete("resp_3") and store.used_bytes == 2 * one_size
    nothing = ResponseStore(0)
    nothing.put(*stored("resp_0", ""))
    assert len(nothing) == 0


def test_a_failure_mid_stream_ends_with_response_failed(server, seeds):
    """The scripted backend writes its script whatever the grammar allows: the JSON begins well,
    and the first token the json_schema grammar refuses fails the request after the stream has
    opened (a request refused at its first token is a 500 before any event)."""
    fields = {"model": MODEL, "input": "Hello", "seed": seeds["json that breaks off"], "store": False,
              "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}}}
    status, headers, body = server.request("POST", "/v1/responses", {**fields, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(block.split("\n")[1].removeprefix("data: "))
              for block in body.decode().strip().split("\n\n") if not block.startswith(":")]
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.failed", events[-1]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error" and failed["error"]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert '{"city": "Paris"' in "".join(e.get("delta", "") for e in events)  # what came before the failure
    status, _, body = server.request("POST", "/v1/responses", fields)
    assert status == 500 and json.loads(body)["error"]["message"], body
    status, _, body = server.request("POST", "/v1/responses", {"model": MODEL, "input": "Hi", "seed": seeds["plain"]})
    assert status == 200 and json.loads(body)["status"] == "completed", body  # still serving
    idle = server.wait_until_idle(timeout_s=30)
    assert idle["kv_blocks_used"] == idle["kv_blocks_cached"] and idle["requests_active"] == 0  # nothing leaked
