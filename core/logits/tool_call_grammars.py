"""Forced tool calls (``tool_choice`` "required" or named) as llguidance Lark grammars, one per
form a tool parser reads, so what the grammar lets the model write is what the parser takes:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, the arguments
  JSON valid against the tool's schema;
- ``qwen3_xml``: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...
  </function>\\n</tool_call>``, the schema's parameters in its order (the required ones always),
  a string's value free text up to the first ``</parameter>`` (of its minLength/maxLength, one
  of its enum), any other value JSON valid against the parameter's schema (the parser reads
  those values as JSON).

Calls are one or more blocks separated by a newline (one with single_call); where the tokenizer has ``<tool_call>`` as
one token the grammar asks for that token (a model never spells it out), otherwise for the text.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..sampling.params import ToolCallFormat
from .json_grammar import JSON_FORMAT, check, closed_objects, json_grammar, parse_schema

TEXT_VALUE = 'text_value[lazy]: /(?s:.*)\\n<\\/parameter>/\n'  # up to the first "\n</parameter>"
NL = "\n"
ANY_PARAMETER = 'any_parameter: "<parameter=" /[^>\\n]+/ ">\\n" text_value "\\n"\n'


def tool_calls_grammar(tool_format: ToolCallFormat, tools: tuple[tuple[str, str], ...], llguidance: Any,
                       validate: Callable[[str], str | None], token_id: Callable[[str], int | None],
                       single_call: bool = False) -> str:
    """``tools``: (name, parameters schema as JSON text) pairs; single_call: one block, not one or more."""
    write_calls = _xml_calls if tool_format == "qwen3_xml" else _hermes_calls
    rules = write_calls([(name, _parameters(name, parameters)) for name, parameters in tools], llguidance, validate)
    opening, closing = (_token_or_text("<tool_call>", token_id), _token_or_text("</tool_call>", token_id))
    calls = "tool_call" if single_call else 'tool_call ("\\n" tool_call)*'
    lark = (
        "%llguidance {}\n"
        f"start: {calls}\n"
        f'tool_call: {opening} "\\n" call "\\n" {closing}\n'
        f"call: {' | '.join(f'call_{i}' for i in range(len(tools)))}\n"
        + rules
    )
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    check(validate(grammar), "tools")
    return grammar


def _parameters(name: str, parameters: str) -> Any:
    schema = parse_schema(parameters, f"tool {name!r} parameters")
    return {"type": "object"} if schema in ({}, None) else closed_objects(schema)  # {}: any arguments


def _hermes_calls(tools: list[tuple[str, Any]], llguidance: Any, validate: Callable[[str], str | None]) -> str:
    rules = []
    for i, (name, arguments) in enumerate(tools):
        json_grammar(llguidance, arguments, validate, f"tool {name!r} parameters")  # names the tool whose schema fails
        call = {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_FORMAT}
        rules.append(f"call_{i}: %json {json.dumps(call)}\n")
    return "".join(rules)


def _xml_calls(tools: list[tuple[str, Any]], llguidance: Any, validate: Callable[[str], str | None]) -> str:
    rules = [TEXT_VALUE, ANY_PARAMETER]
    for i, (name, schema) in enumerate(tools):
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict):
            required = set(schema.get("required", ()))
            parameters = []
            for k, (key, value_schema) in enumerate(properties.items()):
                value = _xml_value(f"value_{i}_{k}", value_schema, llguidance, validate,
                                   f"tool {name!r} parameters {key!r}", rules)
                rules.append(f'parameter_{i}_{k}: {json.dumps(f"<parameter={key}>{NL}")} {value} "\\n"\n')
                parameters.append(f"parameter_{i}_{k}" + ("" if key in required else "?"))
            body = " ".join(parameters)
        else:  # no properties listed: any parameters, unless the schema refuses other keys
            body = "" if isinstance(schema, dict) and schema.get("additionalProperties") is False else "any_parameter*"
        rules.append(f'call_{i}: {json.dumps(f"<function={name}>{NL}")} {body} "</function>"\n')
    return "".join(rules)


def _xml_value(rule: str, schema: Any, llguidance: Any, validate: Callable[[str], str | None], what: str,
               rules: list[str]) -> str:
    """The grammar of one parameter's value through its ``</parameter>``; adds the rules it needs."""
    schema = schema if isinstance(schema, dict) else {}
    declared = schema.get("type")
    types = {declared} if isinstance(declared, str) else set(declared) if isinstance(declared, list) else set()
    enum, low, high = schema.get("enum"), schema.get("minLength"), schema.get("maxLength")
    if types and "string" not in types:
        json_grammar(llguidance, schema, validate, what)  # names the parameter whose schema fails
        rules.append(f"{rule}: %json {json.dumps({**schema, 'x-guidance': JSON_FORMAT})}\n")
        return f'{rule} "\\n</parameter>"'
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        rules.append(f"{rule}: {' | '.join(json.dumps(v) for v in enum)}\n")
        return f'{rule} "\\n</parameter>"'
    if isinstance(low, int) or isinstance(high, int):  # in characters, as JSON Schema counts them
        bounds = f"{low or 0},{high if isinstance(high, int) else ''}"
        rules.append(f"{rule}[lazy]: /(?s:.{{{bounds}}})\\n<\\/parameter>/\n")
        return rule
    return "text_value"  # a string (or no type): the parser keeps the text as written


def _token_or_text(text: str, token_id: Callable[[str], int | None]) -> str:
    token = token_id(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)
