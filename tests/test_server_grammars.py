"""Grammars on the API, through a real server process and the real openai client: vLLM's
structured_outputs (regex, choice, Lark grammar, json, json_object) on chat and legacy completions,
llama.cpp's grammar field (GBNF, translated to Lark), streamed and not; each reply checked with
Python's own re / json / jsonschema, not with the grammar library. Bad grammars and two
constraints at once are 400s naming the field; the server keeps serving."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from server_fixtures import openai_client, smollm2_model_name, smollm2_server  # noqa: F401
from stream_checks import StreamCollector

ASK = [{"role": "user", "content": "Give me a product code, a date or a short answer."}]
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
CHOICES = ["yes", "no", "not sure"]
# a Lark grammar: one to three lowercase words separated by single spaces, then a full stop
LARK = 'start: WORD (" " WORD){0,2} "."\nWORD: /[a-z]{1,8}/'
GBNF = 'root ::= answer "!"\nanswer ::= ("red" | "green" | "blue") (" " [0-9])?'
SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                           "count": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["code", "count"]}


@pytest.fixture(scope="module")
def client(smollm2_server):  # noqa: F811
    with openai_client(smollm2_server) as c:
        yield c


def chat_text(client, model, stream: bool, **extra) -> tuple[str, str]:
    kw = dict(model=model, messages=ASK, temperature=0.9, max_tokens=48, extra_body=extra)
    if stream:
        collected = StreamCollector().collect(client.chat.completions.create(stream=True, **kw))
        return collected.text, collected.finish_reason
    choice = client.chat.completions.create(**kw).choices[0]
    return choice.message.content, choice.finish_reason


CASES = {  # request fields -> does the reply conform (checked without llguidance)
    "regex": ({"structured_outputs": {"regex": DATE}}, lambda t: re.fullmatch(DATE, t) is not None),
    "choice": ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    "lark": ({"structured_outputs": {"grammar": LARK}}, lambda t: re.fullmatch(r"[a-z]{1,8}( [a-z]{1,8}){0,2}\.", t)),
    "json": ({"structured_outputs": {"json": SCHEMA}}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    "json_object": ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(json.loads(t), dict)),
    "gbnf": ({"grammar": GBNF}, lambda t: re.fullmatch(r"(red|green|blue)( [0-9])?!", t) is not None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_chat_replies_follow_the_grammar(client, smollm2_model_name, case, stream):  # noqa: F811
    fields, conforms = CASES[case]
    for seed in range(2):
        text, reason = chat_text(client, smollm2_model_name, stream, seed=seed, **fields)
        assert reason == "stop", text  # the grammar ends the reply well inside max_tokens
        assert conforms(text), text


def test_the_grammar_really_constrains(client, smollm2_model_name):  # noqa: F811
    """The same request without a grammar answers in free text."""
    text, _ = chat_text(client, smollm2_model_name, False, seed=0)
    assert not any(conforms(text) for case, (_, conforms) in CASES.items() if case not in ("json", "json_object"))


@pytest.mark.parametrize("case", ["regex", "choice", "gbnf"])
def test_legacy_completions_take_the_same_fields(client, smollm2_model_name, case):  # noqa: F811
    fields, conforms = CASES[case]
    reply = client.completions.create(model=smollm2_model_name, prompt="The answer is:", max_tokens=48,
                                      temperature=0.9, seed=1, n=2, extra_body=fields)
    for choice in reply.choices:
        assert choice.finish_reason == "stop" and conforms(choice.text), choice.text


@pytest.mark.parametrize("fields, param, message", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", "structured_outputs regex"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "structured_outputs", "structured_outputs grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one of"),
    ({"structured_outputs": {}}, "structured_outputs", "exactly one of"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", ""),
    ({"grammar": "root ::= undefined-rule"}, "grammar", "cannot be translated to Lark (Rule 'undefined-rule' not found)"),
    ({"grammar": "root ::= \"a\"", "structured_outputs": {"regex": "a"}}, "grammar", "cannot be combined with 'structured_outputs'"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar", "cannot be combined with 'response_format'"),
])
def test_bad_grammars_are_400s_naming_the_field(smollm2_server, smollm2_model_name, fields, param, message):  # noqa: F811
    status, _, raw = smollm2_server.chat({"model": smollm2_model_name, "messages": ASK, "max_tokens": 8, **fields})
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"] == param and message in error["message"], error
    smollm2_server.assert_still_serving()
