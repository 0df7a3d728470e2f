"""Chat messages: declared by role, validated strictly, then shaped the way chat templates
expect them.

What a template receives matches what vLLM hands transformers: text content as one string (an
assistant turn that only calls tools gets ""), ``developer`` turns as ``system``, and each
tool call's ``arguments`` parsed from the JSON string of the request into a mapping (Qwen3's
template prints a mapping with ``tojson`` and a string as is; other templates iterate it).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Discriminator, Field, Tag, TypeAdapter, model_validator

from ..errors import InvalidRequest
from .validation import Body, load_json, refused, validate


class TextPart(Body):
    type: Literal["text"]
    text: str


# Parts the OpenAI API defines that a text model cannot read: a 400 naming the part, not a
# complaint that its type is not "text" (a multimodal checkpoint is served as its text model).
REFUSED_PARTS = {kind: refused(kind, name, f"{kind} content parts are not supported: the served model reads text only")
                 for kind, name in (("image_url", "ImageURLPart"), ("input_audio", "InputAudioPart"),
                                    ("file", "FilePart"))}


def _part_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    # a text part, or one whose error says what it should be (a type that is no string too)
    return kind if isinstance(kind, str) and kind in REFUSED_PARTS else "text"


ContentPart = Annotated[Union[tuple([Annotated[TextPart, Tag("text")]] +
                                    [Annotated[model, Tag(kind)] for kind, model in REFUSED_PARTS.items()])],
                        Discriminator(_part_kind)]


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _content_form(value: Any) -> str | None:
    return "text" if isinstance(value, str) else "parts" if isinstance(value, list) else None


Content = Annotated[
    Union[Annotated[str, Tag("text")], Annotated[list[ContentPart], Tag("parts")]],
    Discriminator(_content_form, custom_error_type="content_type",
                  custom_error_message="must be a string or an array of text parts"),
    AfterValidator(_joined)]


def json_object_of(text: str) -> dict[str, Any]:
    try:
        value = load_json(text, "the arguments")
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"must be a JSON object as a string ({exc.msg})") from None
    if not isinstance(value, dict):
        raise InvalidRequest("must be a JSON object as a string")
    return value


class FunctionCall(Body):
    name: str = Field(min_length=1)
    arguments: Annotated[str, AfterValidator(json_object_of)] = Field(description="a JSON object as a string")


class ToolCall(Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(Body):
    name: str | None = None


class PlainMessage(_Message):
    role: Annotated[Literal["system", "user", "developer"],
                    AfterValidator(lambda role: "system" if role == "developer" else role)]
    content: Content
    tool_calls: None = None


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Content | None = Field(None, description="may be left out when tool_calls are given")
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if not self.tool_calls:
            self.tool_calls = None
            if self.content is None:
                raise InvalidRequest("is required unless the message has tool_calls", param="content")
        elif self.content is None:
            self.content = ""
        return self


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: str
    tool_calls: None = None


def _shaped(messages: list[_Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True, warnings=False) for m in messages]  # arguments: parsed


Message = Annotated[Union[PlainMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]
Messages = Annotated[list[Message], Field(min_length=1), AfterValidator(_shaped)]
_MESSAGES = TypeAdapter(Messages)


def parse_messages(value: Any) -> list[dict[str, Any]]:
    """A conversation as the template takes it (for LLM.chat; requests validate it as a field)."""
    return validate(_MESSAGES, value, "messages")
