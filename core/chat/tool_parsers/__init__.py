"""Tool-call parsers, registered by name (``--tool-call-parser``); "none" turns parsing off.

A parser is constructed with the tools offered to the request (the XML form needs their
schemas to type the arguments) and reads one choice's content.
"""
from __future__ import annotations

from ...errors import require_choice
from .base import ToolCall, ToolDelta, ToolParser
from .hermes import HermesToolParser
from .qwen3_xml import Qwen3XmlToolParser

TOOL_PARSERS: dict[str, type | None] = {"hermes": HermesToolParser, "qwen3": HermesToolParser,
                                        "qwen3_xml": Qwen3XmlToolParser, "qwen3_coder": Qwen3XmlToolParser,
                                        "none": None}

__all__ = ["TOOL_PARSERS", "ToolCall", "ToolDelta", "ToolParser", "choose_tool_parser"]


def choose_tool_parser(name: str | None, template_source: str | None = None) -> type | None:
    """By name, or, when none is given, from the template: one that writes ``<function=`` asks for
    Qwen3-Coder's XML form; otherwise Hermes (Qwen3 writes it, and the fallback tool prompt asks
    other models for it)."""
    if name is None:
        name = "qwen3_xml" if template_source and "<function=" in template_source else "hermes"
    require_choice("tool-call parser", name, TOOL_PARSERS)
    return TOOL_PARSERS[name]
