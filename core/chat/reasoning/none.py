"""No reasoning format: everything the model writes is content."""
from __future__ import annotations

from typing import ClassVar

from .base import ReasoningDelta, ThinkState


class NoReasoningParser:
    name: ClassVar[str] = "none"
    end_tag: ClassVar[str | None] = None

    def __init__(self, state: ThinkState = ThinkState.NONE) -> None:
        pass

    @classmethod
    def prompt_state(cls, generation_prompt: str) -> ThinkState:
        return ThinkState.NONE

    def feed(self, text: str) -> ReasoningDelta:
        return ReasoningDelta(content=text)

    def finish(self) -> ReasoningDelta:
        return ReasoningDelta()

    def extract(self, text: str) -> ReasoningDelta:
        return ReasoningDelta(content=text)
