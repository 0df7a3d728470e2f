"""What every reasoning parser shares: the think state read from the prompt and the delta shape.

A parser is a per-request (per-choice) state machine over the generated text. ``feed`` takes
the next piece and returns what became final; ``finish`` flushes what was held back;
``extract`` runs a fresh machine over a whole text, so the whole-text result and the joined
deltas agree by construction, however the text was split into tokens.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable


class ThinkState(enum.Enum):
    """Where generation starts relative to a think block, read from the rendered prompt."""

    NONE = "none"  # no reasoning format: the whole output is content
    CLOSED = "closed"  # the prompt opened and closed the block (thinking off): the output is content
    MAYBE = "maybe"  # the output may open a block itself, as its first thing
    OPEN = "open"  # the prompt opened the block: the output is reasoning until the end tag


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""

    def __add__(self, other: "ReasoningDelta") -> "ReasoningDelta":
        return ReasoningDelta(self.reasoning + other.reasoning, self.content + other.content)


@runtime_checkable
class ReasoningParser(Protocol):
    name: ClassVar[str]
    end_tag: ClassVar[str | None]  # the text that ends reasoning (its token starts a grammar)

    def feed(self, text: str) -> ReasoningDelta: ...

    def finish(self) -> ReasoningDelta: ...

    def extract(self, text: str) -> ReasoningDelta:
        """The whole text at once (call on a fresh parser)."""
