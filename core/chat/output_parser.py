"""One choice's output split into reasoning, content and tool calls: the reasoning parser
first, then the tool parser over the content it leaves, so tool calls are found after
``</think>`` and with thinking off alike, and never inside reasoning."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .reasoning import ReasoningDelta, ReasoningParser
from .tool_parsers import ToolCall, ToolParser


@dataclass
class MessageDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def __add__(self, other: "MessageDelta") -> "MessageDelta":
        return MessageDelta(self.reasoning + other.reasoning, self.content + other.content,
                            self.tool_calls + other.tool_calls)


@dataclass(frozen=True)
class ChatMessage:
    """An assistant message as OpenAI returns it: content is None when only tools were called."""

    content: str | None
    reasoning_content: str | None
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_delta(cls, delta: MessageDelta) -> "ChatMessage":
        content = None if delta.tool_calls and not delta.content else delta.content
        return cls(content, delta.reasoning or None, tuple(delta.tool_calls))

    def as_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return message


class ChatOutputParser:
    def __init__(self, reasoning: ReasoningParser, tools: ToolParser | None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    def feed(self, text: str) -> MessageDelta:
        return self._split(self.reasoning.feed(text), final=False)

    def finish(self) -> MessageDelta:
        return self._split(self.reasoning.finish(), final=True)

    def parse(self, text: str) -> ChatMessage:
        """The whole output at once (call on a fresh parser)."""
        return ChatMessage.from_delta(self.feed(text) + self.finish())

    def _split(self, reasoned: ReasoningDelta, final: bool) -> MessageDelta:
        if self.tools is None:
            return MessageDelta(reasoned.reasoning, reasoned.content)
        found = self.tools.feed(reasoned.content)
        if final:
            found = found + self.tools.finish()
        return MessageDelta(reasoned.reasoning, found.content, found.calls)
