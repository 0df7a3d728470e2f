"""Hermes / Qwen3 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Each block whose body is a JSON object with a string ``name`` (and an object ``arguments``)
becomes a ToolCall; any other block stays content (call_blocks.ToolCallBlocks does the streaming).
The arguments arrive typed as JSON already, so the offered tools are not needed.
"""
from __future__ import annotations

import json
from typing import ClassVar, Sequence

from ...sampling.params import ToolCallFormat
from ..tools import Tool
from .base import ToolCall
from .call_blocks import ToolCallBlocks


class HermesToolParser(ToolCallBlocks):
    name: ClassVar[str] = "hermes"
    call_format: ClassVar[ToolCallFormat] = "hermes"

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(parse_call)


def parse_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):  # not a call: the text stays content
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall.new(value["name"], json.dumps(arguments, ensure_ascii=False))
