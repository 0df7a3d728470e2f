"""Structured output through a real server process and the real openai client: response_format
json_schema (several schemas) and json_object, as JSON and streamed, validated with jsonschema;
tool_choice "required" and a named function give tool_calls whose arguments validate against
the tool's parameters. The engine side is tests/test_structured_output.py (same schemas)."""
from __future__ import annotations

import json

import jsonschema
import pytest
from server_fixtures import openai_client, smollm2_model_name, smollm2_server  # noqa: F401
from stream_checks import StreamCollector
from test_structured_output import SCHEMAS, SEARCH, WEATHER

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Describe a record for a small shop's database as JSON."}]


@pytest.fixture(scope="module")
def client(smollm2_server):  # noqa: F811
    with openai_client(smollm2_server) as c:
        yield c


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_json_schema_replies_validate(client, smollm2_model_name, name, stream):  # noqa: F811
    fmt = {"type": "json_schema", "json_schema": {"name": name.replace(" ", "_"), "schema": SCHEMAS[name]}}
    kw = dict(model=smollm2_model_name, messages=ASK, response_format=fmt, temperature=0.8, seed=3, max_tokens=96)
    if stream:
        collected = StreamCollector().collect(client.chat.completions.create(stream=True, **kw))
        text, reason = collected.text, collected.finish_reason
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, reason = choice.message.content, choice.finish_reason
    assert reason == "stop", text  # the grammar ends the document well inside max_tokens
    jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_json_object_replies_parse(client, smollm2_model_name):  # noqa: F811
    for seed in range(2):
        reply = client.chat.completions.create(
            model=smollm2_model_name, messages=[{"role": "user", "content": "Describe your favourite book."}],
            temperature=0.8, seed=seed, max_tokens=256, response_format={"type": "json_object"})
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "search"}}],
                         ids=["required", "named"])
def test_tool_choice_gives_valid_calls_of_an_offered_tool(client, smollm2_model_name, tool_choice):  # noqa: F811
    """SmolLM2 sometimes repeats calls until max_tokens (finish_reason length): every call the
    reply carries must still be valid, and most replies end with finish_reason tool_calls."""
    ended_with_calls = 0
    for seed in range(3):
        choice = client.chat.completions.create(
            model=smollm2_model_name, temperature=0.8, seed=seed, max_tokens=96, tools=TOOLS, tool_choice=tool_choice,
            messages=[{"role": "user", "content": "What is the weather in Paris? Then search for museums."}],
        ).choices[0]
        calls = choice.message.tool_calls or []
        assert calls, choice.message
        for call in calls:
            assert call.type == "function" and call.id
            if isinstance(tool_choice, dict):
                assert call.function.name == "search"
            jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
        assert choice.finish_reason in ("tool_calls", "length")
        ended_with_calls += choice.finish_reason == "tool_calls"
    assert ended_with_calls >= 2
