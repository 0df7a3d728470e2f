"""Tool-call parsers, registered by name (``--tool-call-parser``); "none" turns parsing off."""
from __future__ import annotations

from ...errors import require_choice
from .base import ToolCall, ToolDelta, ToolParser
from .hermes import HermesToolParser

TOOL_PARSERS: dict[str, type | None] = {"hermes": HermesToolParser, "qwen3": HermesToolParser, "none": None}

__all__ = ["TOOL_PARSERS", "ToolCall", "ToolDelta", "ToolParser", "choose_tool_parser"]


def choose_tool_parser(name: str | None) -> type | None:
    """Hermes by default: Qwen3 writes it, and the fallback tool prompt asks other models for it."""
    name = "hermes" if name is None else name
    require_choice("tool-call parser", name, TOOL_PARSERS)
    return TOOL_PARSERS[name]
