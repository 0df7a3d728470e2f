"""The request bodies of POST /v1/messages and /v1/messages/count_tokens, as pydantic models
(the same strict Body base as the OpenAI routes: null is omitted, fields nobody asked for are
ignored, every rejection names its field).

What agent clients send and this server has no use for is accepted and ignored:
``cache_control`` on blocks, ``metadata``, ``context_management``, server tools (any tool with
a ``type`` other than ``custom``), ``redacted_thinking`` blocks and block types it does not
know. Images and documents are refused: the served models read text only.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from ..chat.tools import JsonSchema
from ..chat.validation import Body, Ignored, integer, parse_json_object, refused, text_or, validate
from ..errors import InvalidRequest

MAX_STOP_SEQUENCES = 64
INT64 = {"ge": -(2**63), "le": 2**63 - 1}


class TextBlock(Body):
    type: Literal["text"]
    text: str


class ThinkingBlock(Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = Field(None, description="any value is accepted")


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any]


ImageBlock = refused("image", "ImageBlock", "image blocks are not supported: the served model reads text only")
DocumentBlock = refused("document", "DocumentBlock",
                        "document blocks are not supported: the served model reads text only")


def _part_kind(value: Any) -> str:
    return value.get("type") if isinstance(value, dict) and value.get("type") == "text" else "other"


ToolResultPart = Annotated[Union[Annotated[TextBlock, Tag("text")], Annotated[Ignored, Tag("other")]],
                           Discriminator(_part_kind)]


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: text_or(ToolResultPart) = Field("", description="text parts are kept; an image becomes "
                                                                   "'[image omitted]'")
    is_error: bool = False

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text if isinstance(p, TextBlock) else "[image omitted]" for p in self.content
                         if isinstance(p, TextBlock) or p.type == "image")


BLOCKS = {"text": TextBlock, "thinking": ThinkingBlock, "tool_use": ToolUseBlock, "tool_result": ToolResultBlock,
          "image": ImageBlock, "document": DocumentBlock}


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) and kind in BLOCKS else "ignored"  # a type that is no string too


ContentBlock = Annotated[Union[tuple(Annotated[model, Tag(kind)] for kind, model in BLOCKS.items())
                               + (Annotated[Ignored, Tag("ignored")],)],
                         Discriminator(_block_kind)]


class MessageParam(Body):
    role: Literal["user", "assistant"]
    content: text_or(ContentBlock)


class SystemBlock(Body):
    type: Literal["text"]
    text: str


class CustomTool(Body):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: JsonSchema
    type: Literal["custom"] = "custom"


def _tool_kind(value: Any) -> str:
    return "custom" if isinstance(value, dict) and value.get("type", "custom") == "custom" else "server"


AnyTool = Annotated[Union[Annotated[CustomTool, Tag("custom")], Annotated[Ignored, Tag("server")]],
                    Discriminator(_tool_kind)]


class ToolChoiceSpec(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="with type tool")
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _tool_is_named(self) -> ToolChoiceSpec:
        if self.type == "tool" and self.name is None:
            raise InvalidRequest("type 'tool' needs the tool's name", param="name")
        return self


class Thinking(Body):
    type: str = Field(description="enabled or disabled switch the template's thinking; adaptive and others "
                                  "leave the template's default")
    budget_tokens: integer(ge=0) | None = Field(None, description="with enabled: tokens the think block may "
                                                "take before the engine closes it")


class JsonSchemaOutput(Body):
    type: Literal["json_schema"]
    schema_: JsonSchema = Field(alias="schema")


class OutputConfig(Body):
    format: JsonSchemaOutput | None = None
    effort: str | None = Field(None, description="low, medium: a think block of at most 1024, 8192 tokens "
                               "(thinking.budget_tokens wins); high, max and others: --reasoning-budget")


class CountTokensRequest(Body):
    model: str = Field(description="any name: this server answers with its one model")
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: text_or(SystemBlock) = ""
    tools: list[AnyTool] = []
    tool_choice: ToolChoiceSpec | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: integer(ge=1) = Field(description="cut to the room the prompt leaves (stop_reason max_tokens)")
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)] = []
    temperature: float = Field(1.0, ge=0, le=2, description="omitted (as top_p and top_k): the model's "
                               "generation_config.json value if it has one, else Anthropic's default")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: integer(ge=0) = Field(0, description="0: off")
    seed: integer(**INT64) | None = Field(None, description="not Anthropic's: for reproducible sampling")
    stream: bool = False


def parse_messages_request(raw: bytes) -> MessagesRequest:
    return validate(MessagesRequest, parse_json_object(raw))


def parse_count_tokens_request(raw: bytes) -> CountTokensRequest:
    return validate(CountTokensRequest, parse_json_object(raw))
