"""Chat templates with arguments: Qwen3's real template renders thinking switches, tools, tool
calls and tool results exactly as transformers' apply_chat_template does on the same messages;
SmolLM2's template, which knows no tools, gets the Hermes description in its system message."""
from __future__ import annotations

import json

import pytest

from qwen_serve.chat.format import ChatFormat
from qwen_serve.chat.messages import parse_messages
from qwen_serve.chat.tools import ToolChoice, parse_tools
from qwen_serve.checkpoints.checkpoint import load_checkpoint

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools are needed.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]
CONVERSATIONS = {
    "one question": [{"role": "user", "content": "Hi!"}],
    "multi-turn with a think block in an old reply": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"}],
    "tool calls and results": TOOL_HISTORY,
    "tool calls and results, then a final answer": [*TOOL_HISTORY, {"role": "assistant", "content": "Sunny, noon."}],
}


@pytest.fixture(scope="module")
def qwen3(qwen3_tiny):
    from transformers import AutoTokenizer

    tokenizer = load_checkpoint(qwen3_tiny).tokenizer
    return ChatFormat(tokenizer), AutoTokenizer.from_pretrained(qwen3_tiny)


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no tools"])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}], ids=["thinking", "thinking off"])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_qwen3_template_renders_as_transformers_does(qwen3, name, kwargs, with_tools):
    ours, reference = qwen3
    messages = parse_messages(CONVERSATIONS[name])
    tools = parse_tools(TOOLS) if with_tools else ()
    rendered = ours.render(messages, tools, template_kwargs=kwargs)
    expected = reference.apply_chat_template(messages, tools=[t.spec for t in tools] or None, tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    assert rendered.text == expected
    assert rendered.token_ids == reference.encode(expected, add_special_tokens=False)


def test_thinking_off_closes_the_think_block_in_the_prompt(qwen3):
    ours, _ = qwen3
    rendered = ours.render(parse_messages(CONVERSATIONS["one question"]), template_kwargs={"enable_thinking": False})
    assert rendered.text == "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_qwen3_template_renders_tools_itself_and_the_history_as_qwen3_writes_it(qwen3):
    ours, _ = qwen3
    assert ours.renders_tools
    text = ours.render(parse_messages(TOOL_HISTORY), parse_tools(TOOLS)).text
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "\n".join(json.dumps(t) for t in TOOLS) in text
    assert ('<|im_start|>assistant\n<think>\nTwo tools are needed.\n</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_tool_choice_none_keeps_tools_out_of_the_prompt(qwen3):
    ours, _ = qwen3
    rendered = ours.render(parse_messages(CONVERSATIONS["one question"]), parse_tools(TOOLS), ToolChoice("none"))
    assert "get_weather" not in rendered.text and rendered.parsed_tools == ()
    named = ours.render(parse_messages(CONVERSATIONS["one question"]), parse_tools(TOOLS),
                        ToolChoice("function", "get_time"))
    assert '"get_time"' in named.text and "get_weather" not in named.text


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return ChatFormat(load_checkpoint(smollm2_path).tokenizer)


def test_smollm2_gets_the_tools_in_its_system_message_in_the_hermes_format(smollm2):
    assert not smollm2.renders_tools
    assert smollm2.reasoning_parser.name == "none"
    text = smollm2.render(parse_messages(TOOL_HISTORY), parse_tools(TOOLS)).text
    system = text[:text.index("<|im_end|>")]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n")
    assert "<tools>\n" + "\n".join(json.dumps(t) for t in TOOLS) + "\n</tools>" in system
    assert "<tool_call>" in system and "</tool_call>" in system  # how to call
    assert ('<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>tool" not in text


def test_smollm2_without_tools_renders_as_before(smollm2, smollm2_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    messages = parse_messages(CONVERSATIONS["multi-turn with a think block in an old reply"])
    assert smollm2.render(messages).text == reference.apply_chat_template(messages, tokenize=False,
                                                                          add_generation_prompt=True)
