"""The request body of POST /v1/responses, as pydantic models (the same strict Body base as the
other routes: null is omitted, fields nobody asked for are ignored, every rejection names its
field). Model names are distinct from the other APIs' (InputMessageItem, not Message): they
share one OpenAPI document.

What agent clients send and this server has no use for is accepted and ignored: ``include``
(but for ``reasoning.encrypted_content``), ``prompt_cache_key``, ``client_metadata``,
``text.verbosity``, ``truncation``, tools that are not functions, items of types it does not
know, item ids and statuses. Images, files and audio are refused: the served models read text
only.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Discriminator, Field, Tag, TypeAdapter

from ..chat.messages import json_object_of
from ..chat.tools import JsonSchema
from ..chat.validation import Body, Ignored, integer, parse_json_object, refused, text_or, validate

INT64 = {"ge": -(2**63), "le": 2**63 - 1}
ENCRYPTED_REASONING = "reasoning.encrypted_content"


class InputTextPart(Body):
    type: Literal["input_text", "output_text"]
    text: str


def _refused(kind: str, name: str) -> type[Body]:
    return refused(kind, name, f"{kind} parts are not supported: the served model reads text only")


PARTS = {"input_text": InputTextPart, "input_image": _refused("input_image", "InputImage"),
         "input_file": _refused("input_file", "InputFile"), "input_audio": _refused("input_audio", "InputAudio")}


def _part_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    kind = "input_text" if kind == "output_text" else kind  # an assistant message's text
    return kind if isinstance(kind, str) and kind in PARTS else "ignored"  # a refusal, or a part type this server does not know


InputPart = Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in PARTS.items())
                            + (Annotated[Ignored, Tag("ignored")],)],
                      Discriminator(_part_kind)]


def joined_text(content: str | list[Any]) -> str:
    """The text of a content string or of its text parts."""
    return content if isinstance(content, str) else "".join(p.text for p in content if isinstance(p, InputTextPart))


class InputMessageItem(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: text_or(InputPart, "content parts")


def _checked_arguments(text: str) -> str:
    json_object_of(text)
    return text


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: Annotated[str, AfterValidator(_checked_arguments)] = Field(description="a JSON object as a string")


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: text_or(InputPart, "content parts")


class ReasoningTextPart(Body):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Body):
    type: Literal["reasoning"]
    summary: list[ReasoningTextPart] = Field([], description="not read: a summary is not the reasoning")
    content: list[ReasoningTextPart] = []
    encrypted_content: str | None = Field(None, description="read when this server wrote it (its reasoning as "
                                                            "base64), else ignored")


ITEMS = {"message": InputMessageItem, "function_call": FunctionCallItem,
         "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message" if "role" in value else None)
    return kind if isinstance(kind, str) and kind in ITEMS else "ignored"  # a type that is no string too


InputItem = Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in ITEMS.items())
                            + (Annotated[Ignored, Tag("ignored")],)],
                      Discriminator(_item_kind, custom_error_type="item_type",
                                    custom_error_message="must be an input item (an object)")]
INPUT_ITEMS = TypeAdapter(list[InputItem])


class FunctionToolSpec(Body):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: JsonSchema | None = Field(None, description="a JSON Schema; left out: no arguments")
    strict: bool | None = None


AnyResponsesTool = Annotated[Union[Annotated[FunctionToolSpec, Tag("function")], Annotated[Ignored, Tag("other")]],
                             Discriminator(lambda v: "function" if isinstance(v, dict) and v.get("type") == "function"
                                           else "other")]


class FunctionToolChoice(Body):
    type: Literal["function"]
    name: str


class PlainTextOutput(Body):
    type: Literal["text"]


class JsonObjectOutput(Body):
    type: Literal["json_object"]


class JsonSchemaTextOutput(Body):
    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: JsonSchema = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Body):
    format: Annotated[Union[PlainTextOutput, JsonObjectOutput, JsonSchemaTextOutput],
                      Field(discriminator="type")] = PlainTextOutput(type="text")


class ReasoningConfig(Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="none and minimal: thinking off; the others: on; left out: the template's default")


class ResponsesRequest(Body):
    model: str | None = Field(None, description="any name: this server answers with its one model")
    input: text_or(InputItem, "input items") = Field(description="a user message, or the conversation's items")
    instructions: str | None = Field(None, description="the first system message (not carried over by "
                                                       "previous_response_id)")
    previous_response_id: str | None = Field(None, description="a stored response whose conversation this continues")
    tools: list[AnyResponsesTool] = Field([], description="function tools; other kinds are ignored")
    tool_choice: Union[Literal["auto", "none", "required"], FunctionToolChoice] = "auto"
    parallel_tool_calls: bool = Field(True, description="false: at most one function call per response")
    max_output_tokens: integer(ge=1) | None = Field(None, description="cut to the room the prompt leaves; left "
                                                                      "out: that room")
    temperature: float = Field(1.0, ge=0, le=2, description="omitted (as top_p): the model's generation_config.json "
                               "value if it has one, else OpenAI's default")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: integer(**INT64) | None = Field(None, description="not OpenAI's: for reproducible sampling")
    reasoning: ReasoningConfig = ReasoningConfig()
    text: TextConfig = TextConfig()
    include: list[str] = Field([], description=f"{ENCRYPTED_REASONING!r} adds the reasoning as encrypted_content; "
                                               "the rest is ignored")
    metadata: dict[str, Any] = {}
    store: bool = Field(True, description="keep the response for GET and previous_response_id "
                                          "(--responses-store-mb)")
    stream: bool = False

    @property
    def items(self) -> list[Any]:
        if isinstance(self.input, str):
            return [InputMessageItem(role="user", content=self.input)]
        return self.input


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    return validate(ResponsesRequest, parse_json_object(raw))
