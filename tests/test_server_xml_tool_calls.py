"""Qwen3-Coder's XML tool calls end to end: a real server on a random Qwen3 checkpoint given a
Qwen3-Coder-style template (tests/qwen3_coder_template.py), so the XML parser is chosen from the
template with no flag; the scripted backend (tests/scripted_backend.py) writes known calls, tags
split across tokens among them, and the real `openai` client reads typed tool_calls, JSON and
streamed alike; and a forced call runs under the XML form's grammar."""
from __future__ import annotations

import json

import pytest
import tokenizers
from chat_stream import JoinedStream, reply_message
from qwen3_coder_template import with_coder_template
from scripted_backend import write_scripts
from server_fixtures import openai_client, scripted_server
from test_server_chat_features import spell

TOOL_CALL, END_TOOL_CALL = 151657, 151658
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "modes": {"type": "array"}}}}},
]
WEATHER = ["<function=get_weather>\n", "<parameter=city>\n", "São Paulo", "\n</parameter>\n",
           "<parameter=days>\n", "3", "\n</parameter>\n", "<parameter=metric>\n", "true", "\n</parameter>\n",
           "</function>\n"]
FILE = ["<", "function", "=write_file>\n", "<param", "eter=path>\n", "notes.md\n</", "parameter>\n",
        "<parameter=content>\n", "# Notes\n\n- one\n", "\n</parameter>\n", "<parameter=modes>\n", '["r", "w"]',
        "\n</parameter>\n</func", "tion>\n"]

# name: (pieces, expected message, expected finish_reason)
CASES = {
    "text, then a call with typed parameters": (
        ["Checking the forecast.", "\n", "<tool_call>", "\n", *WEATHER, "</tool_call>"],
        {"reasoning_content": None, "content": "Checking the forecast.",
         "tool_calls": [("get_weather", {"city": "São Paulo", "days": 3, "metric": True})]}, "tool_calls"),
    "two calls, every tag split across tokens": (
        ["<", "tool", "_call", ">", "\n", *WEATHER, "</", "tool_call", ">", "\n", "<tool", "_call>", "\n", *FILE,
         "</", "tool", "_call", ">"],
        {"reasoning_content": None, "content": None,
         "tool_calls": [("get_weather", {"city": "São Paulo", "days": 3, "metric": True}),
                        ("write_file", {"path": "notes.md", "content": "# Notes\n\n- one\n", "modes": ["r", "w"]})]},
        "tool_calls"),
    "a block without <function= stays content": (
        ["Trying: ", "<tool_call>", "\n<function>get_weather</function>\n", "</tool_call>"],
        {"reasoning_content": None, "content": "Trying: <tool_call>\n<function>get_weather</function>\n</tool_call>",
         "tool_calls": []}, "stop"),
}
FORCED = ["<tool_call>", "\n", *WEATHER, "</tool_call>"]  # what the XML grammar lets through, token by token
FORCED_TWO = [*FORCED, "\n", "<tool_call>", "\n", *FILE, "</tool_call>"]


@pytest.fixture(scope="module")
def scripts(qwen3_tiny, tmp_path_factory) -> dict[str, int]:
    tokenizer = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    spelled = {name: spell(tokenizer, case[0]) for name, case in CASES.items()} | {"forced": spell(tokenizer, FORCED),
                                                                           "forced two": spell(tokenizer, FORCED_TWO)}
    assert not {TOOL_CALL, END_TOOL_CALL} & set(spelled["two calls, every tag split across tokens"]), \
        "the split tags must be ordinary tokens"
    return write_scripts(spelled, tmp_path_factory.mktemp("xml-scripts"))


@pytest.fixture(scope="module")
def server(qwen3_tiny, scripts, tmp_path_factory):
    model = with_coder_template(qwen3_tiny, tmp_path_factory.mktemp("qwen3-coder-template"))
    yield from scripted_server(model, scripts)


@pytest.fixture(scope="module")
def client(server):
    with openai_client(server) as c:
        yield c


@pytest.mark.parametrize("name", CASES)
def test_xml_calls_json_and_stream(client, scripts, name):
    _, expected, finish_reason = CASES[name]
    fields = dict(model=client.models.list().data[0].id, messages=[{"role": "user", "content": "Go."}],
                  tools=TOOLS, seed=scripts[name])
    choice = client.chat.completions.create(**fields).choices[0]
    assert reply_message(choice.message) == expected
    assert choice.finish_reason == finish_reason

    streamed = JoinedStream(client.chat.completions.create(stream=True, **fields))
    joined = streamed.choices[0]
    assert joined.message() == expected, "joined deltas differ from the JSON message"
    assert joined.finish_reason == finish_reason


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_runs_under_the_xml_grammar(client, scripts, tool_choice):
    """The scripted backend writes its script whatever the mask says, and a token the grammar
    refuses fails the request: the XML call passing shows the grammar is the XML one."""
    reply = client.chat.completions.create(model=client.models.list().data[0].id, tools=TOOLS, seed=scripts["forced"],
                                           messages=[{"role": "user", "content": "Go."}], tool_choice=tool_choice)
    assert reply_message(reply.choices[0].message) == {
        "reasoning_content": None, "content": None,
        "tool_calls": [("get_weather", {"city": "São Paulo", "days": 3, "metric": True})]}
    assert reply.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_keeps_the_first_call_on_every_api(server, client, scripts):
    """The script writes two calls; without parallel calls each API gives out the first."""
    first = ("get_weather", {"city": "São Paulo", "days": 3, "metric": True})
    seed, go = scripts["two calls, every tag split across tokens"], [{"role": "user", "content": "Go."}]
    fields = dict(model=client.models.list().data[0].id, messages=go, tools=TOOLS, seed=seed, parallel_tool_calls=False)
    assert reply_message(client.chat.completions.create(**fields).choices[0].message)["tool_calls"] == [first]
    assert JoinedStream(client.chat.completions.create(stream=True, **fields)).choices[0].message()["tool_calls"] == [first]
    assert len(client.chat.completions.create(**{**fields, "parallel_tool_calls": True}).choices[0].message.tool_calls) == 2

    status, _, body = server.request("POST", "/v1/responses", {
        "input": "Go.", "seed": seed, "parallel_tool_calls": False, "store": False,
        "tools": [{"type": "function", **t["function"]} for t in TOOLS]})
    calls = [item for item in json.loads(body)["output"] if item["type"] == "function_call"]
    assert status == 200 and [(c["name"], json.loads(c["arguments"])) for c in calls] == [first], body

    status, _, body = server.request("POST", "/v1/messages", {
        "model": "any", "max_tokens": 200, "messages": go, "seed": seed,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]})
    uses = [block for block in json.loads(body).get("content", []) if block["type"] == "tool_use"]
    assert status == 200 and [(u["name"], u["input"]) for u in uses] == [first], body


def test_a_forced_single_call_grammar_ends_the_reply_after_one_call(client, scripts):
    """tool_choice required with parallel_tool_calls false: the grammar is complete after one
    call, so generation ends there although the script goes on to a second call."""
    fields = dict(model=client.models.list().data[0].id, messages=[{"role": "user", "content": "Go."}], tools=TOOLS,
                  tool_choice="required")
    one = client.chat.completions.create(seed=scripts["forced"], parallel_tool_calls=False, **fields)
    both = client.chat.completions.create(seed=scripts["forced two"], **fields)
    assert len(one.choices[0].message.tool_calls) == 1 and len(both.choices[0].message.tool_calls) == 2
    reply = client.chat.completions.create(seed=scripts["forced two"], parallel_tool_calls=False, **fields)
    single = reply.choices[0]
    assert [call.function.name for call in single.message.tool_calls] == ["get_weather"]
    assert single.finish_reason == "tool_calls" and single.message.content is None
    # generation stopped after the first call (the second was not only dropped from the reply)
    assert reply.usage.completion_tokens <= one.usage.completion_tokens + 1 < both.usage.completion_tokens
