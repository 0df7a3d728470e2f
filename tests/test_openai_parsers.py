"""The reasoning and tool-call parsers on their own: what they make of whole texts (expected
values written out by hand), and that feeding the same text in any pieces gives the same
result (hypothesis chooses the cut points)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwen_serve.chat.output_parser import ChatMessage, ChatOutputParser
from qwen_serve.chat.reasoning import REASONING_PARSERS, ThinkState, choose_reasoning_parser
from qwen_serve.chat.reasoning.qwen3 import Qwen3ReasoningParser
from qwen_serve.chat.tool_parsers import TOOL_PARSERS
from qwen_serve.chat.tool_parsers.hermes import HermesToolParser

MAYBE, OPEN, CLOSED = ThinkState.MAYBE, ThinkState.OPEN, ThinkState.CLOSED
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'

REASONING_CASES = [  # (state, text, reasoning, content)
    (MAYBE, "<think>\nstep one\nstep two\n</think>\n\nThe answer.", "step one\nstep two", "The answer."),
    (MAYBE, "The answer without thinking.", "", "The answer without thinking."),
    (MAYBE, "  <think>x</think>y", "x", "y"),
    (MAYBE, "<think>\ncut off while thinking  \n", "cut off while thinking", ""),
    (MAYBE, "<thin", "", "<thin"),  # ended before a tag was complete: it was text after all
    (MAYBE, "a <think>b</think> c", "", "a <think>b</think> c"),  # only a leading tag opens a block
    (OPEN, "still thinking\n</think>\n\nDone.", "still thinking", "Done."),
    (OPEN, "never closed", "never closed", ""),
    (CLOSED, "<think>not reasoning</think> all content", "", "<think>not reasoning</think> all content"),
    (MAYBE, "<think>\n</think>\n\n\n", "", ""),
]


def pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@pytest.mark.parametrize("state, text, reasoning, content", REASONING_CASES)
def test_qwen3_reasoning_whole_text(state, text, reasoning, content):
    out = Qwen3ReasoningParser(state).extract(text)
    assert (out.reasoning, out.content) == (reasoning, content)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(REASONING_CASES), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_qwen3_reasoning_any_split_gives_the_whole_text_result(case, cuts):
    state, text, reasoning, content = case
    parser = Qwen3ReasoningParser(state)
    got_reasoning, got_content = "", ""
    for piece in pieces(text, cuts):
        delta = parser.feed(piece)
        got_reasoning, got_content = got_reasoning + delta.reasoning, got_content + delta.content
    delta = parser.finish()
    assert (got_reasoning + delta.reasoning, got_content + delta.content) == (reasoning, content)


def test_a_tag_prefix_is_held_back_until_it_resolves():
    parser = Qwen3ReasoningParser(OPEN)
    assert parser.feed("thinking</th").reasoning == "thinking"
    delta = parser.feed("ink>answer")
    assert (delta.reasoning, delta.content) == ("", "answer")


@pytest.mark.parametrize("prompt_end, state", [
    ("<|im_start|>assistant\n", MAYBE),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", CLOSED),
    ("<|im_start|>assistant\n<think>\n", OPEN),
])
def test_think_state_is_read_from_the_generation_prompt(prompt_end, state):
    assert Qwen3ReasoningParser.prompt_state(prompt_end) is state


def test_reasoning_parser_chosen_from_the_template():
    assert choose_reasoning_parser(None, "... '<think>\\n' ...") is REASONING_PARSERS["qwen3"]
    assert choose_reasoning_parser(None, "{{ messages }}") is REASONING_PARSERS["none"]
    assert choose_reasoning_parser("none", "<think>") is REASONING_PARSERS["none"]
    with pytest.raises(Exception, match="unknown reasoning parser 'deepseek'"):
        choose_reasoning_parser("deepseek", None)


TOOL_CASES = [  # (text, content, [(name, arguments)])
    (CALL, "", [("f", {"x": 1})]),
    (f"Sure.\n{CALL}\n{CALL}\n", "Sure.", [("f", {"x": 1}), ("f", {"x": 1})]),
    ('<tool_call>\n{"name": "f", "arguments": {x: 1}}\n</tool_call>', '<tool_call>\n{"name": "f", "arguments": {x: 1}}'
     '\n</tool_call>', []),
    (f"Before\n{CALL}\nafter.", "Before\n\nafter.", [("f", {"x": 1})]),
    (f"{CALL}\n\nText after the call.", "Text after the call.", [("f", {"x": 1})]),
    (f"  {CALL} <tool_call>bad</tool_call>", "<tool_call>bad</tool_call>", [("f", {"x": 1})]),
    ("  Leading space stays", "  Leading space stays", []),
    ('<tool_call>\n{"name": "g", "arguments": {}}', "", [("g", {})]),  # the output ended inside the block
    ('<tool_call>\n{"name": "g", "argu', '<tool_call>\n{"name": "g", "argu', []),
    ('<tool_call>["not", "a call"]</tool_call>', '<tool_call>["not", "a call"]</tool_call>', []),
    ('<tool_call>{"name": "h", "arguments": "{\\"q\\": \\"v\\"}"}</tool_call>', "", [("h", {"q": "v"})]),
    ("No calls, a < sign and <tool", "No calls, a < sign and <tool", []),
    ("Trailing space stays  \n", "Trailing space stays  \n", []),
]


@pytest.mark.parametrize("text, content, calls", TOOL_CASES)
def test_hermes_tool_calls_whole_text(text, content, calls):
    out = HermesToolParser().extract(text)
    assert out.content == content
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls
    assert len({c.id for c in out.calls}) == len(calls) and all(c.id.startswith("call_") for c in out.calls)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(TOOL_CASES), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_hermes_any_split_gives_the_whole_text_result(case, cuts):
    text, content, calls = case
    parser = HermesToolParser()
    got_content, got_calls = "", []
    for piece in [*pieces(text, cuts), None]:
        delta = parser.finish() if piece is None else parser.feed(piece)
        got_content += delta.content
        got_calls += [(c.name, json.loads(c.arguments)) for c in delta.calls]
    assert (got_content, got_calls) == (content, calls)


def test_tool_parsers_are_registered_by_name():
    assert TOOL_PARSERS["hermes"] is TOOL_PARSERS["qwen3"] is HermesToolParser and TOOL_PARSERS["none"] is None


def test_reasoning_and_tools_together():
    """Calls are read after </think>, never inside reasoning; a reply of only calls has content None."""
    parser = ChatOutputParser(Qwen3ReasoningParser(MAYBE), HermesToolParser())
    message = parser.parse(f"<think>\nmaybe {CALL}?\n</think>\n\n{CALL}")
    assert message.reasoning_content == f"maybe {CALL}?"
    assert message.content is None and [c.name for c in message.tool_calls] == ["f"]
    assert message.as_openai()["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_without_reasoning_the_message_has_no_reasoning_field():
    message = ChatOutputParser(REASONING_PARSERS["none"](), None).parse("<think>x</think>")
    assert message == ChatMessage("<think>x</think>", None)
    assert message.as_openai() == {"role": "assistant", "content": "<think>x</think>"}
