"""What every tool-call parser shares: the call, the delta shape and the parser's interface.

Like the reasoning parsers, a tool parser is a per-choice state machine over the content text:
``feed`` returns what became final, ``finish`` flushes, ``extract`` runs a fresh machine over a
whole text, so streamed and whole-text results agree however the text was split. A parser is
built for one choice from the tools offered to its request; ``call_format`` names the form its
calls take, which a grammar writes when ``tool_choice`` forces a call.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from ...sampling.params import ToolCallFormat


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it

    @classmethod
    def new(cls, name: str, arguments: str) -> "ToolCall":
        return cls(f"call_{uuid.uuid4().hex[:24]}", name, arguments)

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolDelta:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __add__(self, other: "ToolDelta") -> "ToolDelta":
        return ToolDelta(self.content + other.content, self.calls + other.calls)


class FirstCallOnly:
    """A tool parser that gives out its first call only (``parallel_tool_calls: false``, and
    Anthropic's ``disable_parallel_tool_use``): later calls are dropped, content is kept."""

    def __init__(self, parser: "ToolParser") -> None:
        self.parser, self.name, self.call_format = parser, parser.name, parser.call_format
        self._given = 0

    def _first(self, delta: ToolDelta) -> ToolDelta:
        kept = delta.calls[:max(0, 1 - self._given)]
        self._given += len(kept)
        return ToolDelta(delta.content, kept)

    def feed(self, text: str) -> ToolDelta:
        return self._first(self.parser.feed(text))

    def finish(self) -> ToolDelta:
        return self._first(self.parser.finish())

    def extract(self, text: str) -> ToolDelta:
        return self._first(self.parser.extract(text))


@runtime_checkable
class ToolParser(Protocol):
    name: ClassVar[str]
    call_format: ClassVar[ToolCallFormat]

    def feed(self, text: str) -> ToolDelta: ...

    def finish(self) -> ToolDelta: ...

    def extract(self, text: str) -> ToolDelta:
        """The whole content at once (call on a fresh parser)."""
