"""Reasoning and tool calls end to end: a real server on a random Qwen3 checkpoint with Qwen3's
real chat template, whose scripted backend (tests/scripted_backend.py) writes known token
sequences, read back through the real `openai` client, JSON and streamed.

Each script is spelled piece by piece: every piece is encoded on its own, so piece boundaries
are token boundaries, and a tag written as several pieces ("</", "think", ">") is made of
ordinary tokens instead of its one added token.
"""
from __future__ import annotations

import json
import uuid

import pytest
import tokenizers
from chat_stream import JoinedStream, reply_message
from scripted_backend import write_scripts
from server_fixtures import openai_client, scripted_server

from qwen_serve.conformance.models import IM_END

THINK, END_THINK, TOOL_CALL, END_TOOL_CALL = 151667, 151668, 151657, 151658
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a time zone",
                                      "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                                                     "required": ["zone"]}}},
]
WEATHER_PARIS = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'

# name: (pieces, request fields, expected message, expected finish_reason)
CASES = {
    "think then answer": (
        ["<think>", "\nThe user asks for the capital of France.\n", "</think>", "\n\n", "The capital is Paris."],
        {}, {"reasoning_content": "The user asks for the capital of France.", "content": "The capital is Paris.",
             "tool_calls": []}, "stop"),
    "think then a tool call": (
        ["<think>", "\nI need the weather tool.\n", "</think>", "\n\n", "<tool_call>", WEATHER_PARIS, "</tool_call>"],
        {"tools": TOOLS}, {"reasoning_content": "I need the weather tool.", "content": None,
                           "tool_calls": [("get_weather", {"city": "Paris"})]}, "tool_calls"),
    "several tool calls": (
        ["<tool_call>", WEATHER_PARIS, "</tool_call>", "\n", "<tool_call>",
         '\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n', "</tool_call>"],
        {"tools": TOOLS}, {"reasoning_content": None, "content": None,
                           "tool_calls": [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "Europe/Paris"})]},
        "tool_calls"),
    "thinking off, text and a tool call": (
        ["Let me check the weather.", "\n", "<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n',
         "</tool_call>"],
        {"tools": TOOLS, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"reasoning_content": None, "content": "Let me check the weather.",
         "tool_calls": [("get_weather", {"city": "Oslo"})]}, "tool_calls"),
    "thinking off: the whole answer is content": (
        ["No thinking here: the answer is 4."],
        {"reasoning_effort": "none"}, {"reasoning_content": None, "content": "No thinking here: the answer is 4.",
                                       "tool_calls": []}, "stop"),
    "tags split across tokens": (
        ["<", "think", ">", "\nSplit tags still separate reasoning.\n", "</", "think", ">", "\n\n", "Answer.", "\n",
         "<", "tool", "_call", ">", '\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n', "</", "tool", "_call", ">"],
        {"tools": TOOLS}, {"reasoning_content": "Split tags still separate reasoning.", "content": "Answer.",
                           "tool_calls": [("get_time", {"zone": "UTC"})]}, "tool_calls"),
    "invalid JSON in a tool call stays content": (
        ["Calling now.", "\n", "<tool_call>", '\n{"name": "get_weather", "arguments": {city: Paris}}\n', "</tool_call>"],
        {"tools": TOOLS}, {"reasoning_content": None, "tool_calls": [],
                           "content": 'Calling now.\n<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}'
                                      '\n</tool_call>'}, "stop"),
}
PLAIN = ["A plain reply."]  # the script of the other tests in this module


def spell(tokenizer: tokenizers.Tokenizer, pieces: list[str]) -> list[int]:
    return [t for piece in pieces for t in tokenizer.encode(piece, add_special_tokens=False).ids] + [IM_END]


@pytest.fixture(scope="module")
def scripts(qwen3_tiny, tmp_path_factory) -> dict[str, int]:
    """Writes every script to a file; returns each case's seed (its script's number)."""
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    spelled = {name: spell(tokenizer, case[0]) for name, case in CASES.items()}
    spelled["plain"] = spell(tokenizer, PLAIN)
    split = spelled["tags split across tokens"]
    assert not {THINK, END_THINK, TOOL_CALL, END_TOOL_CALL} & set(split), "the split tags must be ordinary tokens"
    assert {THINK, END_THINK} <= set(spelled["think then answer"]), "the whole tags must be their added tokens"
    return write_scripts(spelled, tmp_path_factory.mktemp("scripts"))


@pytest.fixture(scope="module")
def server(qwen3_tiny, scripts):
    yield from scripted_server(qwen3_tiny, scripts)


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


@pytest.fixture(scope="module")
def ask(client):
    """A one-question chat request; the seed chooses the script that answers it."""
    model = client.models.list().data[0].id

    def send(seed: int, messages=None, **fields):
        messages = messages or [{"role": "user", "content": "What is the weather in Paris?"}]
        return client.chat.completions.create(model=model, messages=messages, seed=seed, **fields)

    return send


@pytest.mark.parametrize("name", CASES)
def test_reasoning_and_tool_calls_json_and_stream(ask, scripts, name):
    _, fields, expected, finish_reason = CASES[name]
    reply = ask(scripts[name], **fields)
    choice = reply.choices[0]
    assert reply_message(choice.message) == expected
    assert choice.finish_reason == finish_reason
    if expected["tool_calls"] and not expected["content"]:
        assert choice.message.content is None, "a reply of only tool calls has content null"

    streamed = JoinedStream(ask(scripts[name], stream=True, **fields))
    assert list(streamed.choices) == [0]
    joined = streamed.choices[0]
    assert joined.message() == expected, "joined deltas differ from the JSON message"
    assert joined.finish_reason == finish_reason
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in joined.tool_calls.values())
    assert streamed.usage.completion_tokens == reply.usage.completion_tokens


def test_tool_choice_none_leaves_tool_text_as_content(ask, scripts):
    """No tools reach the template and nothing is parsed as a call."""
    reply = ask(scripts["several tool calls"], tools=TOOLS, tool_choice="none")
    message = reply.choices[0].message
    assert not message.tool_calls and reply.choices[0].finish_reason == "stop"
    assert message.content.count("<tool_call>") == 2 and '"get_time"' in message.content


def test_include_usage_moves_usage_to_a_last_chunk_without_choices(ask, scripts):
    streamed = JoinedStream(ask(scripts["think then answer"], stream=True,
                                stream_options={"include_usage": True}), include_usage=True)
    reply = ask(scripts["think then answer"])
    assert streamed.choices[0].finish_reason == "stop"
    assert streamed.usage.completion_tokens == reply.usage.completion_tokens
    assert streamed.usage.prompt_tokens == reply.usage.prompt_tokens


def test_repeated_long_prompt_reports_cached_tokens(ask, scripts):
    messages = [{"role": "user", "content": f"{uuid.uuid4().hex} " + "tell me more about the weather " * 12}]
    first = ask(scripts["plain"], messages)
    second = ask(scripts["plain"], messages)
    prompt_tokens = first.usage.prompt_tokens
    assert prompt_tokens > 64
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # every full 16-token block but the one holding the last prompt token comes from the cache
    assert second.usage.prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // 16 * 16
    assert second.choices[0].message.content == PLAIN[0]


@pytest.mark.parametrize("fields", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}],
                         ids=["enable_thinking false", "reasoning_effort none"])
def test_tokenize_renders_the_template_as_chat_does(server, qwen3_tiny, ask, scripts, fields):
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    status, _, raw = server.request("POST", "/tokenize", {"messages": messages, "tools": TOOLS, **fields})
    assert status == 200, raw
    tokens = json.loads(raw)["tokens"]
    closed = tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False).ids
    assert tokens[-len(closed):] == closed
    assert "<tools>" in tokenizer.decode(tokens, skip_special_tokens=False)
    extra = {"extra_body": fields} if "chat_template_kwargs" in fields else fields
    reply = ask(scripts["plain"], messages, tools=TOOLS, **extra)
    assert reply.usage.prompt_tokens == len(tokens)
