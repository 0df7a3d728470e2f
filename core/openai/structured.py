"""The request side of structured output: `response_format`, vLLM's `structured_outputs`,
llama.cpp's `grammar` (GBNF), and `tool_choice` "required" or a named function, become the
StructuredOutput the engine enforces with a grammar.

``after_token_id`` is known only once the prompt is rendered: when the prompt leaves a think
block open, the constraint starts after the token that closes it (Qwen3's ``</think>``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, Field, model_validator

from ..chat.tools import JsonSchema, Tool, ToolChoice
from ..chat.validation import Body
from ..errors import InvalidRequest
from ..logits.grammars import lark_from_gbnf
from ..sampling.params import StructuredOutput, ToolCallFormat


@dataclass(frozen=True)
class ResponseFormat:
    """A constraint on the reply's text: from response_format, vLLM's structured_outputs or
    llama.cpp's grammar (``field``, which an error about it names)."""

    kind: Literal["json_object", "json_schema", "regex", "choice", "grammar"]
    schema: str | None = None  # the JSON schema, regex, JSON array of choices or Lark grammar
    field: str = "response_format"


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


class StructuredOutputs(Body):
    """vLLM's structured_outputs: exactly one of its constraints."""

    json_: JsonSchema | None = Field(None, alias="json", description="a JSON schema the reply validates against")
    json_object: bool | None = Field(None, description="true: any JSON object")
    regex: str | None = Field(None, description="a regular expression the whole reply matches (Rust regex syntax)")
    choice: list[str] | None = Field(None, min_length=1, description="the reply is exactly one of these strings")
    grammar: str | None = Field(None, description="a Lark grammar (llguidance's dialect) the reply belongs to")

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json_", "json_object", "regex", "choice", "grammar") if getattr(self, name)]
        if len(given) != 1:
            raise InvalidRequest("must set exactly one of json, json_object, regex, choice and grammar")
        return self

    def constraint(self) -> ResponseFormat:
        field = "structured_outputs"
        if self.json_ is not None:
            return ResponseFormat("json_schema", json.dumps(self.json_, sort_keys=True), field)
        if self.json_object:
            return ResponseFormat("json_object", None, field)
        if self.regex is not None:
            return ResponseFormat("regex", self.regex, field)
        if self.choice is not None:
            return ResponseFormat("choice", json.dumps(self.choice), field)
        return ResponseFormat("grammar", self.grammar, field)


def gbnf_constraint(gbnf: str) -> ResponseFormat:
    """llama.cpp's ``grammar`` field (GBNF), translated to Lark."""
    return ResponseFormat("grammar", lark_from_gbnf(gbnf, "grammar"), "grammar")


def one_constraint(**given: ResponseFormat | None) -> ResponseFormat | None:
    """The one constraint among the fields that may carry one; two at once is a 400."""
    named = [name for name, value in given.items() if value is not None]
    if len(named) > 1:
        raise InvalidRequest(f"cannot be combined with '{named[0]}'", param=named[1])
    return given[named[0]] if named else None


def structured_output(response_format: ResponseFormat | None, tool_choice: ToolChoice, tools: tuple[Tool, ...],
                      after_token_id: int | None, tool_format: ToolCallFormat = "hermes",
                      single_call: bool = False) -> StructuredOutput | None:
    """The constraint a request asks for, if any; forced calls in ``tool_format``, the form the
    model's tool parser reads (ChatFormat.tool_format)."""
    forced_tools = tool_choice.mode in ("required", "function")
    if forced_tools and response_format is not None:
        raise InvalidRequest(f"'{response_format.field}' {response_format.kind!r} cannot be combined with "
                             f"'tool_choice' {tool_choice.name or tool_choice.mode!r}", param=response_format.field)
    if forced_tools:
        offered = tool_choice.offered(tools)
        return StructuredOutput("tool_calls", tools=tuple((t.name, _schema_text(t, tool_format)) for t in offered),
                                after_token_id=after_token_id, tool_format=tool_format, single_call=single_call)
    if response_format is None:
        return None
    return StructuredOutput(response_format.kind, schema=response_format.schema, after_token_id=after_token_id,
                            field=response_format.field)


def _schema_text(tool: Tool, tool_format: ToolCallFormat) -> str:
    """The XML form's grammar writes the parameters in the order the client listed them (the order
    the template shows the model), so their order is kept; a Hermes call's JSON takes sorted keys."""
    return json.dumps(tool.parameters) if tool_format == "qwen3_xml" else tool.parameters_json
