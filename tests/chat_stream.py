"""Joining openai-client streams per choice, with the chunk contract checked on the way:
every choice opens with a role-only delta and finishes exactly once; usage appears exactly
once, in the last chunk (a trailing chunk without choices when include_usage was asked)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JoinedChoice:
    role: str | None = None
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, type, name, arguments
    finish_reasons: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # legacy completions
    deltas: int = 0

    def message(self) -> dict[str, Any]:
        """reasoning_content, content and tool calls (arguments parsed) as the stream spelled them."""
        return {"reasoning_content": "".join(self.reasoning) or None, "content": "".join(self.content) or None,
                "tool_calls": [(c["name"], json.loads(c["arguments"])) for _, c in sorted(self.tool_calls.items())]}

    @property
    def finish_reason(self) -> str:
        assert len(self.finish_reasons) == 1, f"finish_reason given {len(self.finish_reasons)} times"
        return self.finish_reasons[0]


class JoinedStream:
    def __init__(self, stream, include_usage: bool = False) -> None:
        self.chunks = list(stream)
        self.choices: dict[int, JoinedChoice] = {}
        for chunk in self.chunks:
            for choice in chunk.choices:
                self._add(choice)
        with_usage = [i for i, c in enumerate(self.chunks) if c.usage is not None]
        assert with_usage == [len(self.chunks) - 1], f"usage in chunks {with_usage} of {len(self.chunks)}"
        if include_usage:
            assert self.chunks[-1].choices == [], "include_usage: the usage chunk has no choices"
        self.usage = self.chunks[-1].usage

    def _add(self, choice: Any) -> None:
        joined = self.choices.setdefault(choice.index, JoinedChoice())
        if choice.finish_reason is not None:
            joined.finish_reasons.append(choice.finish_reason)
        if hasattr(choice, "text"):  # a legacy completion chunk
            joined.text.append(choice.text or "")
            return
        delta = choice.delta
        if joined.deltas == 0:
            assert delta.role == "assistant" and not delta.content, f"first delta {delta}"
        joined.deltas += 1
        if delta.role is not None:
            joined.role = delta.role
        joined.reasoning.append(getattr(delta, "reasoning_content", None) or "")
        joined.content.append(delta.content or "")
        for call in delta.tool_calls or []:
            parts = joined.tool_calls.setdefault(call.index, {"id": "", "type": "", "name": "", "arguments": ""})
            parts["id"] += call.id or ""
            parts["type"] += call.type or ""
            parts["name"] += call.function.name or ""
            parts["arguments"] += call.function.arguments or ""


def reply_message(message: Any) -> dict[str, Any]:
    """The same three fields of a non-stream openai-client message, each call checked for shape."""
    calls = []
    for call in message.tool_calls or []:
        assert call.id.startswith("call_") and call.type == "function", call
        calls.append((call.function.name, json.loads(call.function.arguments)))
    return {"reasoning_content": getattr(message, "reasoning_content", None), "content": message.content or None,
            "tool_calls": calls}
