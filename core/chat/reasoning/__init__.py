"""Reasoning parsers, registered by name (``--reasoning-parser``), one per model family."""
from __future__ import annotations

from ...errors import require_choice
from .base import ReasoningDelta, ReasoningParser, ThinkState
from .none import NoReasoningParser
from .qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type] = {"qwen3": Qwen3ReasoningParser, "none": NoReasoningParser}

__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser", "ThinkState", "choose_reasoning_parser"]


def choose_reasoning_parser(name: str | None, template_source: str | None) -> type:
    """By name, or, when none is given, from the template: one that writes <think> is Qwen3's."""
    if name is None:
        name = "qwen3" if template_source and "<think>" in template_source else "none"
    require_choice("reasoning parser", name, REASONING_PARSERS)
    return REASONING_PARSERS[name]
