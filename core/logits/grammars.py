"""StructuredOutput -> an llguidance grammar (JSON text), and the checks that name what is wrong.

JSON comes out on one line with json.dumps' separators (``{"a": 1, "b": [2, 3]}``): with free
whitespace a small model can spend its whole budget on newlines and never close the document.
For the same reason an object that lists its properties takes no others unless its schema says
so (``additionalProperties``), as xgrammar's strict mode does by default: the output still
validates against the schema, and a model cannot wander off into keys of its own.
Tool calls are Qwen3's Hermes blocks, ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``,
one or more separated by a newline; where the tokenizer has ``<tool_call>`` as one token the
grammar asks for that token (a model never spells it out), otherwise for the text.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..errors import InvalidRequest
from ..sampling.params import StructuredOutput

JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_for(structured: StructuredOutput, llguidance: Any, validate: Callable[[str], str | None],
                token_id: Callable[[str], int | None]) -> str:
    """The grammar text; InvalidRequest naming the part the library cannot compile.

    ``validate(grammar)`` returns the library's error message or None; ``token_id(text)`` the id
    of a text that the tokenizer holds as one added token.
    """
    if structured.kind == "json_object":
        return _json_grammar(llguidance, {"type": "object"}, validate, "response_format")
    if structured.kind == "json_schema":
        schema = _parse(structured.schema, "response_format json_schema")
        return _json_grammar(llguidance, closed_objects(schema), validate, "response_format json_schema")
    return _tool_calls_grammar(structured.tools, llguidance, validate, token_id)


def _parse(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what}: the schema is not valid JSON ({exc})", param=_param(what)) from None


def _json_grammar(llguidance: Any, schema: Any, validate: Callable[[str], str | None], what: str) -> str:
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{what}: a schema must be a JSON object", param=_param(what))
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_FORMAT)
    except ValueError as exc:
        raise InvalidRequest(f"{what}: {exc}", param=_param(what)) from None
    _check(validate(grammar), what)
    return grammar


def _tool_calls_grammar(tools: tuple[tuple[str, str], ...], llguidance: Any, validate: Callable[[str], str | None],
                        token_id: Callable[[str], int | None]) -> str:
    bodies = []
    for name, parameters in tools:
        what = f"tool {name!r} parameters"
        arguments = _parse(parameters, what)
        if arguments in ({}, None):
            arguments = {"type": "object"}  # no parameters declared: any object of arguments
        arguments = closed_objects(arguments)
        _json_grammar(llguidance, arguments, validate, what)  # names the tool whose schema fails
        call = {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_FORMAT}
        bodies.append(f"%json {json.dumps(call)}")
    opening, closing = (_token_or_text("<tool_call>", token_id), _token_or_text("</tool_call>", token_id))
    lark = (
        "%llguidance {}\n"
        'start: tool_call ("\\n" tool_call)*\n'
        f'tool_call: {opening} "\\n" call "\\n" {closing}\n'
        f"call: {' | '.join(f'call_{i}' for i in range(len(bodies)))}\n"
        + "".join(f"call_{i}: {body}\n" for i, body in enumerate(bodies))
    )
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    _check(validate(grammar), "tools")
    return grammar


def closed_objects(schema: Any) -> Any:
    """A copy where every object schema that lists ``properties`` and says nothing about other
    keys (additionalProperties, patternProperties, unevaluatedProperties) allows no other keys."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) if k not in ("const", "enum", "default", "examples") else v
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and not {"additionalProperties", "patternProperties",
                                                           "unevaluatedProperties"} & schema.keys():
        out["additionalProperties"] = False
    return out


def _token_or_text(text: str, token_id: Callable[[str], int | None]) -> str:
    token = token_id(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def _check(error: str | None, what: str) -> None:
    if error:
        raise InvalidRequest(f"{what}: {error.strip()}", param=_param(what))


def _param(what: str) -> str:
    """The request field a message is about: response_format, or tools for a tool's schema."""
    return "response_format" if what.startswith("response_format") else "tools"
