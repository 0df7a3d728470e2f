"""A reply as an ordered run of blocks (reasoning, text, each tool call), the way Anthropic's
Messages API and OpenAI's Responses API stream one: a block starts, takes deltas, and stops
before the next begins. The blocks come from the same MessageDeltas the chat stream is made of,
so a reply assembled from a stream's events equals the reply built from the whole output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from .output_parser import MessageDelta
from .tool_parsers import ToolCall

BlockKind = Literal["reasoning", "text", "tool_call"]


@dataclass(frozen=True)
class BlockStart:
    index: int
    kind: BlockKind
    call: ToolCall | None = None  # with kind "tool_call": its id and name (its arguments follow as a delta)


@dataclass(frozen=True)
class BlockDelta:
    index: int
    kind: BlockKind
    text: str  # reasoning or text, or a tool call's arguments (a JSON object as text)


@dataclass(frozen=True)
class BlockStop:
    index: int
    kind: BlockKind


BlockEvent = Union[BlockStart, BlockDelta, BlockStop]


class BlockAssembler:
    """Per choice: MessageDeltas in, block events out. Reasoning, then text, then tool calls is
    the order within one delta (the order the parsers find them in); a kind that changes closes
    the open block, and each tool call is a block of its own, given whole."""

    def __init__(self) -> None:
        self._open: BlockKind | None = None
        self._count = 0

    def take(self, delta: MessageDelta) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        for kind, text in (("reasoning", delta.reasoning), ("text", delta.content)):
            if text:
                if self._open != kind:
                    events += self._stop()
                    events.append(self._start(kind))
                events.append(BlockDelta(self._count - 1, kind, text))
        for call in delta.tool_calls:
            events += self._stop()
            events += [self._start("tool_call", call), BlockDelta(self._count - 1, "tool_call", call.arguments)]
            events += self._stop()
        return events

    def finish(self) -> list[BlockEvent]:
        """The events that close the reply (the open block's stop)."""
        return self._stop()

    def _start(self, kind: BlockKind, call: ToolCall | None = None) -> BlockStart:
        self._open = kind
        self._count += 1
        return BlockStart(self._count - 1, kind, call)

    def _stop(self) -> list[BlockEvent]:
        if self._open is None:
            return []
        kind, self._open = self._open, None
        return [BlockStop(self._count - 1, kind)]
