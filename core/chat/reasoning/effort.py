"""What a reasoning effort means for Qwen's thinking models, on every API that has one
(``reasoning_effort`` in Chat Completions, ``reasoning.effort`` in the Responses API,
``output_config.effort`` in Messages, where only the budget applies): none and
minimal turn the template's thinking off; low and medium let a think block take at most this many
tokens before the engine closes it; high and xhigh leave it to the server's --reasoning-budget."""
from __future__ import annotations

from typing import Any

THINKING_OFF = ("none", "minimal")
EFFORT_BUDGETS = {"low": 1024, "medium": 8192}


def effort_template_kwargs(effort: str | None) -> dict[str, Any]:
    return {} if effort is None else {"enable_thinking": effort not in THINKING_OFF}


def effort_budget(effort: str | None) -> int | None:
    """The thinking budget of an effort (None: the server's default)."""
    return EFFORT_BUDGETS.get(effort or "")
