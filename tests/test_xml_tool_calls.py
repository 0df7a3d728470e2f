"""Qwen3-Coder's XML tool calls: the parser types each argument by the offered tool's schema and
gives the same result however the text is split (every single cut, one character at a time,
and random cuts); a template that writes ``<function=`` chooses the parser and the forced-call
grammar's form; that grammar lets through XML calls of the offered tools and nothing else, and
SmolLM2 sampling under it writes calls the parser reads back as valid arguments."""
from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen3_coder_template import QWEN3_CODER_TEMPLATE

from qwen_serve import LLM, SamplingParams
from qwen_serve.chat.format import ChatFormat
from qwen_serve.chat.messages import parse_messages
from qwen_serve.chat.output_parser import ChatOutputParser
from qwen_serve.chat.reasoning import ThinkState
from qwen_serve.chat.reasoning.qwen3 import Qwen3ReasoningParser
from qwen_serve.chat.tool_parsers import TOOL_PARSERS
from qwen_serve.chat.tool_parsers.hermes import HermesToolParser
from qwen_serve.chat.tool_parsers.qwen3_xml import Qwen3XmlToolParser
from qwen_serve.chat.tools import ToolChoice, parse_tools
from qwen_serve.checkpoints.tokenizer import Tokenizer
from qwen_serve.conformance.models import QWEN3_CHAT_TEMPLATE
from qwen_serve.conformance.qwen_tokenizer import qwen_tokenizer_json_path
from qwen_serve.logits.grammars import grammar_for
from qwen_serve.openai.structured import structured_output
from qwen_serve.sampling.params import StructuredOutput

PLAN = {"type": "object", "properties": {
    "title": {"type": "string"}, "days": {"type": "integer"}, "budget": {"type": "number"},
    "confirmed": {"type": "boolean"}, "options": {"type": "object"}, "stops": {"type": "array"},
    "note": {"type": ["string", "null"]}}, "required": ["title"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "plan_trip", "parameters": PLAN}},
         {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
OFFERED = parse_tools(TOOLS)


def call(name: str, **parameters: str) -> str:
    return (f"<tool_call>\n<function={name}>\n"
            + "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
            + "</function>\n</tool_call>")


PARIS = call("get_weather", city="Paris")
TRIP = call("plan_trip", title="Alps\n\n  in spring ", days="3", budget="1250.5", confirmed="true",
            options='{"rail": true, "class": 2}', stops='["Bern", "Zermatt"]', note="null")
TRIP_ARGUMENTS = {"title": "Alps\n\n  in spring ", "days": 3, "budget": 1250.5, "confirmed": True,
                  "options": {"rail": True, "class": 2}, "stops": ["Bern", "Zermatt"], "note": None}

CASES = [  # (text, content, [(name, arguments)])
    (TRIP, "", [("plan_trip", TRIP_ARGUMENTS)]),
    (f"Let me look that up.\n\n{PARIS}\n{call('get_weather', city='Oslo', unit='celsius')}",
     "Let me look that up.", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    (call("plan_trip", title="x", days="three", stops="[1, 2"), "",  # does not parse: kept as text
     [("plan_trip", {"title": "x", "days": "three", "stops": "[1, 2"})]),
    (call("plan_trip", title='{"a": 1}', budget="NaN", note="a note"), "",  # a string stays a string
     [("plan_trip", {"title": '{"a": 1}', "budget": "NaN", "note": "a note"})]),
    (call("unknown_tool", n="1"), "", [("unknown_tool", {"n": "1"})]),  # no schema: strings
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>", "",
     [("get_weather", {"city": "Rome"})]),  # an unclosed parameter ends at </function>, as vLLM reads it
    (f"{PARIS}\n\nDone, see above.", "Done, see above.", [("get_weather", {"city": "Paris"})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', []),  # Hermes: content
    ("<tool_call>\n<function>\nget_weather\n</function>\n</tool_call>",
     "<tool_call>\n<function>\nget_weather\n</function>\n</tool_call>", []),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",  # cut off before </function>
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", []),
    (f"{PARIS[:-len('</tool_call>')]}", "", [("get_weather", {"city": "Paris"})]),  # the output ended in the block
    ("Two functions in one block:<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n</tool_call>",
     "Two functions in one block:<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n</tool_call>", []),
    ("A < sign, a <tool and <function=x> outside a block.", "A < sign, a <tool and <function=x> outside a block.", []),
]


def run(parser, pieces: list[str]) -> tuple[str, list]:
    content, calls = "", []
    for piece in [*pieces, None]:
        delta = parser.finish() if piece is None else parser.feed(piece)
        content += delta.content
        calls += [(c.name, json.loads(c.arguments)) for c in delta.calls]
    return content, calls


@pytest.mark.parametrize("text, content, calls", CASES)
def test_whole_text(text, content, calls):
    out = Qwen3XmlToolParser(OFFERED).extract(text)
    assert (out.content, [(c.name, json.loads(c.arguments)) for c in out.calls]) == (content, calls)
    assert len({c.id for c in out.calls}) == len(calls)


@pytest.mark.parametrize("text, content, calls", CASES)
def test_every_cut_and_every_character_give_the_whole_text_result(text, content, calls):
    for cut in range(len(text) + 1):
        assert run(Qwen3XmlToolParser(OFFERED), [text[:cut], text[cut:]]) == (content, calls), cut
    assert run(Qwen3XmlToolParser(OFFERED), list(text)) == (content, calls)


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 400), max_size=16))
def test_any_split_gives_the_whole_text_result(case, cuts):
    text, content, calls = case
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    assert run(Qwen3XmlToolParser(OFFERED), pieces) == (content, calls)


def test_no_tag_leaks_while_streaming():
    """Fed one character at a time, a stream gives out no piece of a tag, and the call once whole."""
    parser, given, calls = Qwen3XmlToolParser(OFFERED), "", []
    for ch in f"Checking.\n{PARIS}":
        delta = parser.feed(ch)
        given, calls = given + delta.content, calls + delta.calls
        assert "<" not in given
    assert given == "Checking." and [c.name for c in calls] == ["get_weather"]


def test_a_call_inside_reasoning_is_not_parsed():
    parser = ChatOutputParser(Qwen3ReasoningParser(ThinkState.MAYBE), Qwen3XmlToolParser(OFFERED))
    message = parser.parse(f"<think>\nMaybe {PARIS}?\n</think>\n\n{PARIS}")
    assert message.reasoning_content == f"Maybe {PARIS}?"
    assert message.content is None
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_registered_under_vllms_names():
    assert TOOL_PARSERS["qwen3_xml"] is TOOL_PARSERS["qwen3_coder"] is Qwen3XmlToolParser
    assert TOOL_PARSERS["hermes"] is HermesToolParser


@pytest.fixture(scope="module")
def qwen_backend() -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(qwen_tokenizer_json_path()))


@pytest.fixture(scope="module")
def coder(qwen_backend) -> ChatFormat:
    return ChatFormat(Tokenizer(qwen_backend, QWEN3_CODER_TEMPLATE, eos_token="<|im_end|>"))


def test_a_template_that_writes_function_tags_chooses_the_xml_parser(coder, qwen_backend):
    assert coder.tool_parser is Qwen3XmlToolParser and coder.tool_format == "qwen3_xml"
    assert coder.renders_tools
    qwen3 = ChatFormat(Tokenizer(qwen_backend, QWEN3_CHAT_TEMPLATE))
    assert qwen3.tool_parser is HermesToolParser and qwen3.tool_format == "hermes"
    named = ChatFormat(Tokenizer(qwen_backend, QWEN3_CODER_TEMPLATE), tool_call_parser="hermes")
    assert named.tool_parser is HermesToolParser, "a name given on the command line wins"


def test_the_templates_own_call_parses_back_to_its_arguments(coder):
    """A call the template renders in the history is the form the model writes: parsed with the
    tools' schemas, it gives back the arguments the client sent."""
    arguments = {k: v for k, v in TRIP_ARGUMENTS.items() if k != "note"}
    history = parse_messages([
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "plan_trip", "arguments": json.dumps(arguments)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "planned"}])
    rendered = coder.render(history, OFFERED)
    assert "<function>\n<name>plan_trip</name>" in rendered.text
    block = re.search(r"<tool_call>\n<function=plan_trip>.*?</tool_call>", rendered.text, re.S)[0]
    message = coder.output_parser(rendered).parse(block)
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("plan_trip", arguments)]


def test_a_forced_call_asks_for_the_parsers_form(coder):
    rendered = coder.render(parse_messages([{"role": "user", "content": "Weather?"}]), OFFERED)
    forced = ToolChoice("function", "get_weather")
    structured = structured_output(None, forced, OFFERED, coder.constraint_start(rendered), tool_format=coder.tool_format)
    assert structured == StructuredOutput("tool_calls", tools=(("get_weather", json.dumps(WEATHER)),),
                                          tool_format="qwen3_xml"), "the XML form keeps the parameters' order"
    assert structured_output(None, forced, OFFERED, None).tool_format == "hermes", "the default is unchanged"
    with pytest.raises(ValueError, match="unknown tool call format 'xml'"):
        StructuredOutput("tool_calls", tools=(("f", "{}"),), tool_format="xml")


class Matcher:
    """Grammars compiled against Qwen's tokenizer; a text is fed as its tokens."""

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        self.backend = backend
        self.library = llguidance.LLTokenizer(backend.to_str(), n_vocab=backend.get_vocab_size(True))

    def grammar(self, structured: StructuredOutput) -> str:
        def validate(text):
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.library)
            return messages[0] if failed else None

        def token_id(text):
            ids = self.backend.encode(text, add_special_tokens=False).ids
            return ids[0] if len(ids) == 1 else None

        return grammar_for(structured, llguidance, validate, token_id)

    def accepts(self, grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(self.library, grammar, log_level=0)
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


XML_TOOLS = structured_output(None, ToolChoice("required"), OFFERED, None, tool_format="qwen3_xml")


@pytest.mark.parametrize("text, accepted", [
    (PARIS, True),
    (f"{call('get_weather', city='Oslo', unit='celsius')}\n{call('plan_trip', title='Alps', days='3')}", True),
    (call("plan_trip", title="A title\nover </param lines", days="3", confirmed="false", options='{"a": [1]}',
          stops='["x"]', note="free text"), True),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', False),  # Hermes
    (call("plan_trip", days="3"), False),  # the required title is missing
    (call("plan_trip", title="x", days="three"), False),  # an integer must be one
    (call("get_weather", city="Paris", unit="kelvin"), False),  # not in the enum
    (call("get_weather", city="Paris", wind="yes"), False),  # not a parameter of the tool
    (call("send_mail", to="x"), False),  # not an offered tool
    ("Sure: " + PARIS, False),  # the call comes first
])
def test_the_xml_grammar_takes_calls_of_the_offered_tools_only(qwen_backend, text, accepted):
    matcher = Matcher(qwen_backend)
    assert matcher.accepts(matcher.grammar(XML_TOOLS), text) is accepted


def test_the_hermes_grammar_is_unchanged_and_refuses_xml(qwen_backend):
    matcher = Matcher(qwen_backend)
    hermes = matcher.grammar(StructuredOutput("tool_calls", tools=XML_TOOLS.tools))
    assert matcher.accepts(hermes, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert not matcher.accepts(hermes, PARIS)


SHORT_WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 40},
                                          "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
          "required": ["query", "limit"]}
SAMPLED_TOOLS = parse_tools([{"type": "function", "function": {"name": "get_weather", "parameters": SHORT_WEATHER}},
                             {"type": "function", "function": {"name": "search", "parameters": SEARCH}}])


def test_string_lengths_bound_the_free_text(qwen_backend):
    matcher = Matcher(qwen_backend)
    grammar = matcher.grammar(structured_output(None, ToolChoice("required"), SAMPLED_TOOLS, None,
                                                tool_format="qwen3_xml"))
    assert matcher.accepts(grammar, call("search", query="museums\nin Paris", limit="5"))
    assert not matcher.accepts(grammar, call("search", query="x" * 41, limit="5"))
    assert not matcher.accepts(grammar, call("search", query="", limit="5"))


def test_smollm2_sampling_under_the_xml_grammar_writes_calls_the_parser_reads(smollm2_path):
    """SmolLM2 never saw this form; the grammar alone makes it write it (now and then it keeps
    calling until max_tokens: every closed block must still be a valid call)."""
    llm = LLM(str(smollm2_path))
    prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "What is the weather in Paris? Then search "
                                                                    "for museums."}])
    structured = structured_output(None, ToolChoice("required"), SAMPLED_TOOLS, None, tool_format="qwen3_xml")
    schemas = {"get_weather": SHORT_WEATHER, "search": SEARCH}
    finished = 0
    for out in llm.generate([prompt] * 6, [SamplingParams(temperature=0.8, seed=seed, max_tokens=128,
                                                          structured=structured) for seed in range(6)]):
        end = out.text.rfind("</tool_call>") + len("</tool_call>")
        parsed = Qwen3XmlToolParser(SAMPLED_TOOLS).extract(out.text[:end])
        assert parsed.calls and parsed.content == "", out.text
        for found in parsed.calls:
            jsonschema.validate(json.loads(found.arguments), schemas[found.name])
        rest = out.text[end:]
        assert rest == "" if out.finish_reason == "stop" else "\n<tool_call>\n<function=".startswith(rest[:22])
        finished += out.finish_reason == "stop"
    assert finished >= 1
