"""Anthropic's Messages API end to end, through the real `anthropic` SDK.

A scripted server (a random Qwen3 checkpoint with Qwen3's real chat template; the seed chooses a
known reply, tests/scripted_backend.py) checks the translation both ways: thinking, text, a tool
round trip, stop sequences, usage and count_tokens, the stream joined by the SDK equal to the
non-streamed message. The embedded model's server checks what needs real sampling: tool_choice
any / tool enforced by the grammar, and a seeded sampled reply the same streamed or not.
"""
from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
import tokenizers
from scripted_backend import write_scripts
from server_fixtures import scripted_server, smollm2_server  # noqa: F401
from test_server_chat_features import WEATHER_PARIS, spell
from test_structured_output import SEARCH, WEATHER

THINK_THEN_ANSWER = ["<think>", "\nThe user asks for the capital of France.\n", "</think>", "\n\n",
                     "The capital is Paris."]
SCRIPTS = {
    "think then answer": THINK_THEN_ANSWER,
    "tool call": ["<think>", "\nI need the weather tool.\n", "</think>", "\n\n",
                  "<tool_call>", WEATHER_PARIS, "</tool_call>"],
    "plain": ["It is sunny in Paris."],
    "stop sequence": ["Counting: one, two,", " STOP", " three."],
}
WEATHER_TOOL = {"name": "get_weather", "description": "Current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MODEL = "claude-sonnet-4-5"  # any name is served: agent clients send their user's choice


@pytest.fixture(scope="module")
def seeds(qwen3_tiny, tmp_path_factory) -> dict[str, int]:
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    return write_scripts({name: spell(tokenizer, pieces) for name, pieces in SCRIPTS.items()},
                         tmp_path_factory.mktemp("scripts"))


@pytest.fixture(scope="module")
def server(qwen3_tiny, seeds):
    yield from scripted_server(qwen3_tiny, seeds)


def sdk(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="not-needed",
                               max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(server):
    with sdk(server) as c:
        yield c


def without_ids(message) -> dict:
    """A message but for what is new each time: its id, its tool calls' ids and its usage."""
    body = message.model_dump(exclude={"id", "usage"})
    for block in body["content"]:
        block.pop("id", None)
    return body


def both_ways(client: anthropic.Anthropic, **fields):
    """The message, created and streamed (joined by the SDK), after checking they agree."""
    created = client.messages.create(model=MODEL, max_tokens=64, **fields)
    with client.messages.stream(model=MODEL, max_tokens=64, **fields) as stream:
        streamed = stream.get_final_message()
    assert streamed.id != created.id
    assert without_ids(streamed) == without_ids(created)
    assert streamed.usage.output_tokens == created.usage.output_tokens
    assert (streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens
            == created.usage.input_tokens + created.usage.cache_read_input_tokens)
    return created


def test_thinking_then_text(client, seeds):
    message = both_ways(client, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024},
                        extra_body={"seed": seeds["think then answer"]})
    assert message.model == MODEL and message.role == "assistant" and message.type == "message"
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user asks for the capital of France."
    assert message.content[0].signature  # the SDK sends it back on the next turn
    assert message.content[1].text == "The capital is Paris."
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, thinking={"type": "enabled",
                                                                                "budget_tokens": 1024})
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens


def test_tool_round_trip(client, server, seeds):
    first = both_ways(client, messages=ASK, tools=[WEATHER_TOOL], extra_body={"seed": seeds["tool call"]})
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    call = first.content[1]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"}) and call.id.startswith("toolu_")
    assert first.stop_reason == "tool_use"

    conversation = ASK + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                        "content": "18 degrees, sunny"}]}]
    answer = both_ways(client, messages=conversation, tools=[WEATHER_TOOL], extra_body={"seed": seeds["plain"]})
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text == "It is sunny in Paris."
    assert answer.stop_reason == "end_turn"

    # The conversation renders as the same chat does in OpenAI's shape.
    counted = client.messages.count_tokens(model=MODEL, messages=conversation, tools=[WEATHER_TOOL])
    openai_messages = ASK + [
        {"role": "assistant", "content": "", "reasoning_content": first.content[0].thinking,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    tools = [{"type": "function", "function": {"name": WEATHER_TOOL["name"], "description": WEATHER_TOOL["description"],
                                               "parameters": WEATHER_TOOL["input_schema"]}}]
    status, _, body = server.request("POST", "/tokenize", {"messages": openai_messages, "tools": tools})
    assert status == 200, body
    assert counted.input_tokens == json.loads(body)["count"]


def test_stop_sequence(client, seeds):
    message = both_ways(client, messages=ASK, stop_sequences=["STOP"], extra_body={"seed": seeds["stop sequence"]})
    assert message.content[0].text == "Counting: one, two, "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "STOP")


def test_max_tokens_past_the_context_is_cut_to_fit(server, seeds):
    """As agent clients send (Claude Code: 32000): the reply gets the room the prompt leaves."""
    status, _, body = server.request("POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 10**9, "messages": ASK, "seed": seeds["plain"]})
    assert status == 200, body
    assert json.loads(body)["content"] == [{"type": "text", "text": "It is sunny in Paris."}]


def test_system_blocks_and_what_agents_send_that_is_not_used(client, server, seeds):
    """System as blocks with cache_control, metadata, server tools, unknown blocks: accepted;
    Claude Code's billing line, whose nonce changes every request, is left out of the prompt."""
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=1a2b3c;"},
              {"type": "text", "text": "You are a weather assistant.", "cache_control": {"type": "ephemeral"}}]
    message = client.messages.create(
        model=MODEL, max_tokens=16, system=system, messages=ASK, metadata={"user_id": "u1"},
        extra_body={"seed": seeds["plain"], "context_management": {"edits": []},
                    "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert message.content[0].text == "It is sunny in Paris."
    with_billing = client.messages.count_tokens(model=MODEL, system=system, messages=ASK).input_tokens
    without = client.messages.count_tokens(model=MODEL, system=system[1:], messages=ASK).input_tokens
    assert with_billing == without


@pytest.mark.parametrize("body, param", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"max_tokens": 8, "messages": ASK, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": {"not": "a string"}}]}]}, "type"),
])
def test_bad_requests_are_400_in_anthropic_shape(client, body, param):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body={"model": MODEL, **body}, cast_to=object)
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert param in error["error"]["message"]


def test_unknown_route_is_404_in_anthropic_shape(server):
    status, _, body = server.request("POST", "/v1/messages/nothing", {})
    assert status == 404
    assert json.loads(body)["error"]["type"] == "not_found_error"


def test_head_of_root_answers(server):
    status, _, _ = server.request("HEAD", "/")
    assert status == 200


# --- real sampling on the embedded model -----------------------------------------------------
SAMPLED_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}, {"name": "search", "input_schema": SEARCH}]


@pytest.fixture(scope="module")
def sampled(smollm2_server):  # noqa: F811
    with sdk(smollm2_server) as c:
        yield c


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "search"}], ids=["any", "tool"])
def test_tool_choice_is_enforced(sampled, tool_choice):
    schemas = {t["name"]: t["input_schema"] for t in SAMPLED_TOOLS}
    message = sampled.messages.create(
        model=MODEL, max_tokens=96, tools=SAMPLED_TOOLS, tool_choice=tool_choice,
        messages=[{"role": "user", "content": "Find me something."}], extra_body={"temperature": 0.8, "seed": 3})
    calls = [b for b in message.content if b.type == "tool_use"]
    assert calls, message
    # The grammar allows several calls: a reply cut while writing one more says max_tokens.
    assert message.stop_reason == ("max_tokens" if message.usage.output_tokens == 96 else "tool_use")
    for call in calls:
        jsonschema.validate(call.input, schemas[call.name])
        if tool_choice["type"] == "tool":
            assert call.name == "search"


def test_seeded_sampling_is_the_same_streamed_or_not(sampled):
    fields = {"messages": [{"role": "user", "content": "Tell me about the sea."}],
              "extra_body": {"temperature": 0.9, "top_k": 40, "seed": 11}}
    created = both_ways(sampled, **fields)
    assert created.content and created.content[0].type == "text" and created.content[0].text


@pytest.mark.parametrize("fields, budget", [
    ({"output_config": {"effort": "low"}}, 1024),
    ({"output_config": {"effort": "medium"}}, 8192),
    ({"output_config": {"effort": "high"}}, None),  # the server's --reasoning-budget
    ({"output_config": {"effort": "low"}, "thinking": {"type": "enabled", "budget_tokens": 50}}, 50),
    ({}, None),
])
def test_output_config_effort_sets_the_thinking_budget(fields, budget):
    from qwen_serve.anthropic.protocol import MessagesRequest
    from qwen_serve.anthropic.translate import chat_turn

    req = MessagesRequest.model_validate({"model": "any", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                                          **fields})
    assert chat_turn(req).thinking_budget == budget
