"""Request JSON onto the engine's contract: the SamplingParams and StructuredOutput that the
parsing builds, compared with ones written out by hand."""
from __future__ import annotations

import json

import pytest
import tokenizers

from qwen_serve.chat.format import ChatFormat
from qwen_serve.chat.messages import parse_messages
from qwen_serve.chat.reasoning import ThinkState
from qwen_serve.checkpoints.tokenizer import Tokenizer
from qwen_serve.conformance.models import QWEN3_CHAT_TEMPLATE
from qwen_serve.conformance.qwen_tokenizer import qwen_tokenizer_json_path
from qwen_serve.errors import InvalidRequest
from qwen_serve.openai.protocol import (
    ChatCompletionRequest,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from qwen_serve.openai.structured import structured_output
from qwen_serve.sampling.params import SamplingParams, StructuredOutput

VOCAB = 151936
END_THINK = 151668
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
         {"type": "function", "function": {"name": "ping", "description": "no parameters"}}]


def chat(**fields):
    return parse_chat_request(json.dumps({"messages": HELLO, **fields}).encode(), VOCAB)


def test_every_sampling_field_reaches_sampling_params():
    req = chat(n=3, presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1,
               logit_bias={"11": -100, "42": 5.5}, min_p=0.05, stop_token_ids=[13, 198], min_tokens=2,
               ignore_eos=True, seed=7, top_k=20, temperature=0.7, top_p=0.9, max_completion_tokens=30,
               stop=["END"], logprobs=True, top_logprobs=3, stream=True, stream_options={"include_usage": True})
    assert req.params == SamplingParams(
        n=3, presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1,
        logit_bias={11: -100.0, 42: 5.5}, min_p=0.05, stop_token_ids=(13, 198), min_tokens=2, ignore_eos=True,
        seed=7, top_k=20, temperature=0.7, top_p=0.9, max_tokens=30, stop=("END",), logprobs=3)
    assert req.params.logit_bias == ((11, -100.0), (42, 5.5))
    assert req.stream and req.include_usage


def test_defaults_are_the_spec_defaults():
    req = chat()
    assert req.params == SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=256)
    assert not req.stream and not req.include_usage and req.response_format is None and req.tools == ()
    assert req.tool_choice.mode == "auto" and not req.max_tokens_given
    assert chat(max_completion_tokens=5).max_tokens_given


def test_a_null_field_is_the_field_left_out():
    """As the OpenAPI document says (every optional property may be null), at any depth."""
    optional = [name for name in ChatCompletionRequest.model_fields if name != "messages"]
    assert chat(**dict.fromkeys(optional)) == chat()
    history = [{"role": "user", "content": "Weather?", "name": None},
               {"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": [
                   {"id": "c1", "type": None, "function": {"name": "f", "arguments": "{}"}}]}]
    assert chat(messages=history).messages == chat(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f",
                                                                                        "arguments": "{}"}}]}]).messages


@pytest.mark.parametrize("response_format, expected", [
    ({"type": "text"}, None),
    ({"type": "json_object"}, StructuredOutput("json_object")),
    ({"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array"}}}}},
     StructuredOutput("json_schema", schema='{"properties": {"name": {"type": "string"}, "tags": {"type": "array"}}, '
                                           '"type": "object"}')),
])
def test_response_format_becomes_structured_output(response_format, expected):
    req = chat(response_format=response_format)
    assert structured_output(req.response_format, req.tool_choice, req.tools, None) == expected
    if expected is not None:
        assert structured_output(req.response_format, req.tool_choice, req.tools, END_THINK).after_token_id == END_THINK


@pytest.mark.parametrize("tool_choice, expected_tools", [
    ("required", (("get_weather", json.dumps(WEATHER_PARAMETERS, sort_keys=True)),
                  ("ping", '{"properties": {}, "type": "object"}'))),
    ({"type": "function", "function": {"name": "get_weather"}},
     (("get_weather", json.dumps(WEATHER_PARAMETERS, sort_keys=True)),)),
])
def test_required_or_named_tool_choice_becomes_a_tool_calls_constraint(tool_choice, expected_tools):
    req = chat(tools=TOOLS, tool_choice=tool_choice)
    assert structured_output(req.response_format, req.tool_choice, req.tools, None) == StructuredOutput(
        "tool_calls", tools=expected_tools)


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
def test_auto_and_none_tool_choice_constrain_nothing(tool_choice):
    req = chat(tools=TOOLS, tool_choice=tool_choice)
    assert structured_output(req.response_format, req.tool_choice, req.tools, None) is None
    assert [t.name for t in req.tool_choice.offered(req.tools)] == ([] if tool_choice == "none" else ["get_weather", "ping"])


@pytest.fixture(scope="module")
def qwen_backend() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(qwen_tokenizer_json_path()))


# Qwen3's template with the generation prompt of the later thinking-only checkpoints, which open
# the think block themselves.
OPENING_TEMPLATE = QWEN3_CHAT_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}", "{{- '<|im_start|>assistant\\n<think>\\n' }}")


@pytest.mark.parametrize("template, kwargs, state, after", [
    (QWEN3_CHAT_TEMPLATE, {}, ThinkState.MAYBE, None),
    (QWEN3_CHAT_TEMPLATE, {"enable_thinking": False}, ThinkState.CLOSED, None),
    (OPENING_TEMPLATE, {}, ThinkState.OPEN, END_THINK),
])
def test_grammar_starts_after_think_when_the_prompt_leaves_it_open(qwen_backend, template, kwargs, state, after):
    assert OPENING_TEMPLATE != QWEN3_CHAT_TEMPLATE
    chat_format = ChatFormat(Tokenizer(qwen_backend, template, None, "<|im_end|>"))
    rendered = chat_format.render(parse_messages(HELLO), template_kwargs=kwargs)
    assert rendered.think_state is state
    assert chat_format.constraint_start(rendered) == after


def test_reasoning_effort_none_turns_thinking_off_unless_the_template_kwargs_say_otherwise():
    assert chat(reasoning_effort="none").template_kwargs == {"enable_thinking": False}
    assert chat(reasoning_effort="minimal").template_kwargs == {"enable_thinking": False}
    assert chat(reasoning_effort="high").template_kwargs == {"enable_thinking": True}
    assert chat().template_kwargs == {}
    assert chat(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True, "x": 1}).template_kwargs == {
        "enable_thinking": True, "x": 1}


def test_messages_are_shaped_for_the_template():
    messages = parse_messages([
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Weather?", "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "Use the tool.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?", "name": "ann"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]


@pytest.mark.parametrize("prompt, expected", [
    ("Hello", ["Hello"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_completion_prompts(prompt, expected):
    req = parse_completion_request(json.dumps({"prompt": prompt, "logprobs": 2, "n": 2}).encode(), VOCAB)
    assert req.prompt == expected
    assert req.params == SamplingParams(max_tokens=16, logprobs=2, n=2) and not req.max_tokens_given


def test_tokenize_and_detokenize_requests():
    req = parse_tokenize_request(json.dumps({"messages": HELLO, "tools": TOOLS[:1], "add_generation_prompt": False,
                                             "chat_template_kwargs": {"enable_thinking": False}}).encode())
    assert req.prompt is None and req.messages == HELLO and not req.add_generation_prompt
    assert [t.name for t in req.tools] == ["get_weather"] and req.template_kwargs == {"enable_thinking": False}
    assert not req.add_special_tokens  # the template writes the special tokens
    assert parse_tokenize_request(b'{"prompt": "hi"}').add_special_tokens
    assert parse_detokenize_request(b'{"tokens": [1, 2]}', 100).tokens == [1, 2]
    assert parse_detokenize_request(b'{"tokens": [1.0, 2]}', 100).tokens == [1, 2]  # an integer to JSON Schema
    with pytest.raises(InvalidRequest, match=r"'tokens\[0\]': Input should be a valid integer"):
        parse_detokenize_request(b'{"tokens": [1.5]}', 100)
    with pytest.raises(InvalidRequest, match=r"'tokens': token ids must be in \[0, 100\), got 100"):
        parse_detokenize_request(b'{"tokens": [1, 100]}', 100)
