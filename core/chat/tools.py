"""`tools` and `tool_choice`: validated, kept as the client sent them for the template.

Each tool's ``parameters`` must be a valid JSON Schema (checked with the `jsonschema` library
against its meta-schema), since with ``tool_choice`` "required" or a named function it becomes the
grammar the arguments are drawn from.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from ..errors import InvalidRequest
from .fields import string

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: omitted parameters = no arguments


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    spec: dict[str, Any] = field(repr=False)  # the request's own object, what the template renders

    @property
    def parameters_json(self) -> str:
        return json.dumps(self.parameters, sort_keys=True)


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["none", "auto", "required", "function"] = "auto"
    name: str | None = None  # with mode "function"

    def offered(self, tools: tuple[Tool, ...]) -> tuple[Tool, ...]:
        """The tools the template and the parser see (none with "none", one when named)."""
        if self.mode == "none":
            return ()
        if self.mode == "function":
            return tuple(t for t in tools if t.name == self.name)
        return tools


def parse_tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(value))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise InvalidRequest(f"'tools[{i}].function.name': {tool.name!r} is offered twice",
                                 param=f"tools[{i}].function.name")
        seen.add(tool.name)
    return tools


def _tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    if tool.get("type") != "function":
        raise InvalidRequest(f"'{where}.type' must be \"function\"", param=f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"'{where}.function' must be an object", param=f"{where}.function")
    name = string(function, "name", f"{where}.function", required=True)
    if not NAME.fullmatch(name):
        raise InvalidRequest(f"'{where}.function.name' must be 1 to 64 letters, digits, '_', '.' or '-', "
                             f"got {name!r}", param=f"{where}.function.name")
    string(function, "description", f"{where}.function")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    elif not isinstance(parameters, dict):
        raise InvalidRequest(f"'{where}.function.parameters' must be an object (a JSON Schema)",
                             param=f"{where}.function.parameters")
    else:
        check_json_schema(parameters, f"{where}.function.parameters")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"'{where}.function.strict' must be a boolean", param=f"{where}.function.strict")
    return Tool(name, copy.deepcopy(parameters), copy.deepcopy(tool))


def check_json_schema(schema: dict[str, Any], field_name: str) -> None:
    """400 naming the part of ``schema`` that its meta-schema rejects."""
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = exc.json_path.replace("$", field_name, 1)
        raise InvalidRequest(f"'{field_name}' is not a valid JSON Schema: at '{where}': {exc.message}",
                             param=field_name) from None


def parse_tool_choice(value: Any, tools: tuple[Tool, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    if value in ("none", "auto", "required"):
        choice = ToolChoice(value)
    elif isinstance(value, dict):
        if value.get("type") != "function" or not isinstance(value.get("function"), dict):
            raise InvalidRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
        choice = ToolChoice("function", string(value["function"], "name", "tool_choice.function", required=True))
    else:
        raise InvalidRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or an object naming a function",
                             param="tool_choice")
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest(f"'tool_choice' {choice.name or choice.mode!r} needs 'tools'", param="tool_choice")
    if choice.mode == "function" and not choice.offered(tools):
        offered = ", ".join(repr(t.name) for t in tools)
        raise InvalidRequest(f"'tool_choice' names {choice.name!r}, which is not among the offered tools ({offered})",
                             param="tool_choice")
    return choice
