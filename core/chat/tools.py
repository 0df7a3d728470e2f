"""`tools` and `tool_choice`: validated, kept as the client sent them for the template.

Each tool's ``parameters`` must be a valid JSON Schema (checked with the `jsonschema` library
against its meta-schema), since with ``tool_choice`` "required" or a named function it becomes the
grammar the arguments are drawn from.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

import jsonschema
from pydantic import AfterValidator, Field, TypeAdapter

from ..errors import InvalidRequest
from .validation import Body, validate

NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: omitted parameters = no arguments


def check_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` if its meta-schema accepts it; else a 400 naming the part it rejects."""
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"is not a valid JSON Schema: at '{exc.json_path}': {exc.message}") from None
    return schema


JsonSchema = Annotated[dict[str, Any], AfterValidator(check_json_schema), Field(description="a JSON Schema")]


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    spec: dict[str, Any] = field(repr=False)  # the request's object, what the template renders

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

    def check(self, tools: tuple[Tool, ...]) -> None:
        """A forced choice needs tools, and a named one a tool of that name."""
        if self.mode in ("required", "function") and not tools:
            raise InvalidRequest(f"{self.name or self.mode!r} needs 'tools'", param="tool_choice")
        if self.mode == "function" and not self.offered(tools):
            offered = ", ".join(repr(t.name) for t in tools)
            raise InvalidRequest(f"names {self.name!r}, which is not among the offered tools ({offered})",
                                 param="tool_choice")


class FunctionDefinition(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: JsonSchema | None = Field(None, description="a JSON Schema; left out: no arguments")
    strict: bool | None = None


class ToolDefinition(Body):
    type: Literal["function"]
    function: FunctionDefinition


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> Tool:
    """A function tool as chat templates render one (OpenAI's shape, whatever API offered it)."""
    function = {"name": name, "description": description, "parameters": parameters}
    spec = {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}
    return Tool(name, parameters or NO_PARAMETERS, spec)


def distinct_names(tools: tuple[Tool, ...], name_path: str) -> tuple[Tool, ...]:
    """``tools`` if no two share a name; name_path is the path of tool i's name with {i} in it."""
    names = [t.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidRequest(f"{name!r} is offered twice", param=name_path.format(i=i))
    return tools


def _tools(definitions: list[ToolDefinition]) -> tuple[Tool, ...]:
    return distinct_names(tuple(Tool(d.function.name, d.function.parameters or NO_PARAMETERS,
                                     d.model_dump(exclude_none=True)) for d in definitions), "[{i}].function.name")


Tools = Annotated[list[ToolDefinition], AfterValidator(_tools)]
_TOOLS = TypeAdapter(Tools)


def parse_tools(value: Any) -> tuple[Tool, ...]:
    """Tools as the template and the grammar take them (for LLM.chat; requests validate them as a field)."""
    return () if value is None else validate(_TOOLS, value, "tools")


class FunctionName(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: FunctionName


def _tool_choice(value: str | NamedToolChoice) -> ToolChoice:
    return ToolChoice("function", value.function.name) if isinstance(value, NamedToolChoice) else ToolChoice(value)


ToolChoiceField = Annotated[Union[Literal["none", "auto", "required"], NamedToolChoice], AfterValidator(_tool_choice)]
