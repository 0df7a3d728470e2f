"""The request side of structured output: `response_format`, and `tool_choice` "required" or a
named function, become the StructuredOutput the engine enforces with a grammar.

``after_token_id`` is known only once the prompt is rendered: when the prompt leaves a think
block open, the constraint starts after the token that closes it (Qwen3's ``</think>``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, Field

from ..chat.tools import JsonSchema, Tool, ToolChoice
from ..chat.validation import Body
from ..errors import InvalidRequest
from ..sampling.params import StructuredOutput, ToolCallFormat


@dataclass(frozen=True)
class ResponseFormat:
    kind: Literal["json_object", "json_schema"]
    schema: str | None = None  # JSON text, with kind json_schema


class TextFormat(Body):
    type: Literal["text"]


class JsonObjectFormat(Body):
    type: Literal["json_object"]


class JsonSchemaSpec(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: JsonSchema = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


def _response_format(value: TextFormat | JsonObjectFormat | JsonSchemaFormat) -> ResponseFormat | None:
    """None for plain text."""
    if isinstance(value, JsonSchemaFormat):
        return ResponseFormat("json_schema", json.dumps(value.json_schema.schema_, sort_keys=True))
    return ResponseFormat("json_object") if isinstance(value, JsonObjectFormat) else None


ResponseFormatField = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaFormat], Field(discriminator="type"),
                                AfterValidator(_response_format)]


def structured_output(response_format: ResponseFormat | None, tool_choice: ToolChoice, tools: tuple[Tool, ...],
                      after_token_id: int | None, tool_format: ToolCallFormat = "hermes") -> StructuredOutput | None:
    """The constraint a request asks for, if any; forced calls in ``tool_format``, the form the
    model's tool parser reads (ChatFormat.tool_format)."""
    forced_tools = tool_choice.mode in ("required", "function")
    if forced_tools and response_format is not None:
        raise InvalidRequest(f"'response_format' {response_format.kind!r} cannot be combined with 'tool_choice' "
                             f"{tool_choice.name or tool_choice.mode!r}", param="response_format")
    if forced_tools:
        offered = tool_choice.offered(tools)
        return StructuredOutput("tool_calls", tools=tuple((t.name, _schema_text(t, tool_format)) for t in offered),
                                after_token_id=after_token_id, tool_format=tool_format)
    if response_format is None:
        return None
    return StructuredOutput(response_format.kind, schema=response_format.schema, after_token_id=after_token_id)


def _schema_text(tool: Tool, tool_format: ToolCallFormat) -> str:
    """The XML form's grammar writes the parameters in the order the client listed them (the order
    the template shows the model), so their order is kept; a Hermes call's JSON takes sorted keys."""
    return json.dumps(tool.parameters) if tool_format == "qwen3_xml" else tool.parameters_json
