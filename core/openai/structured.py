"""The request side of structured output: `response_format`, and `tool_choice` "required" or a
named function, become the StructuredOutput the engine enforces with a grammar.

``after_token_id`` is known only once the prompt is rendered: when the prompt leaves a think
block open, the constraint starts after the token that closes it (Qwen3's ``</think>``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ..chat.fields import mapping, string
from ..chat.tools import Tool, ToolChoice, check_json_schema
from ..errors import InvalidRequest
from ..sampling.params import StructuredOutput

SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ResponseFormat:
    kind: Literal["json_object", "json_schema"]
    schema: str | None = None  # JSON text, with kind json_schema


def parse_response_format(value: Any) -> ResponseFormat | None:
    """None for plain text (absent or {"type": "text"})."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind != "json_schema":
        raise InvalidRequest("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                             param="response_format.type")
    where = "response_format.json_schema"
    spec = mapping(value, "json_schema", "response_format", required=True)
    name = string(spec, "name", where, required=True)
    if not SCHEMA_NAME.fullmatch(name):
        raise InvalidRequest(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-', got {name!r}",
                             param=f"{where}.name")
    string(spec, "description", where)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
    schema = mapping(spec, "schema", where, required=True)
    check_json_schema(schema, f"{where}.schema")
    return ResponseFormat("json_schema", json.dumps(schema, sort_keys=True))


def structured_output(response_format: ResponseFormat | None, tool_choice: ToolChoice, tools: tuple[Tool, ...],
                      after_token_id: int | None) -> StructuredOutput | None:
    """The constraint a request asks for, if any."""
    forced_tools = tool_choice.mode in ("required", "function")
    if forced_tools and response_format is not None:
        raise InvalidRequest(f"'response_format' {response_format.kind!r} cannot be combined with 'tool_choice' "
                             f"{tool_choice.name or tool_choice.mode!r}", param="response_format")
    if forced_tools:
        offered = tool_choice.offered(tools)
        return StructuredOutput("tool_calls", tools=tuple((t.name, t.parameters_json) for t in offered),
                                after_token_id=after_token_id)
    if response_format is None:
        return None
    return StructuredOutput(response_format.kind, schema=response_format.schema, after_token_id=after_token_id)
