"""A Messages request as the ChatTurn every chat-shaped API runs as.

Blocks become the message shape chat templates take: ``tool_use`` blocks an assistant turn's
``tool_calls``, each ``tool_result`` a ``tool`` message, ``thinking`` the turn's
``reasoning_content``. ``tool_choice`` any / tool / none are OpenAI's required / named / none
(a grammar enforces the first two), and ``thinking`` enabled / disabled is Qwen's
``enable_thinking`` switch.

Claude Code puts a billing line with a fresh nonce in the first system block of every request
(``x-anthropic-billing-header: ...; cch=...;``); it is dropped, or the long system prompt would
never repeat and never hit the prefix cache.
"""
from __future__ import annotations

import json
from typing import Any

from ..chat.reasoning.effort import effort_budget
from ..chat.tools import Tool, ToolChoice, distinct_names, function_tool
from ..openai.structured import ResponseFormat
from ..openai.turn import ChatTurn
from ..sampling.defaults import SamplingDefaults
from ..sampling.params import SamplingParams
from .protocol import (
    CountTokensRequest,
    CustomTool,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

BILLING_HEADER = "x-anthropic-billing-header:"
TOOL_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


def chat_turn(req: CountTokensRequest, sampling_defaults: SamplingDefaults = SamplingDefaults()) -> ChatTurn:
    """The turn of a count_tokens request, or of a Messages request with its sampling (the
    model's defaults for the sampling fields it leaves out)."""
    tools = distinct_names(tuple(function_tool(t.name, t.description, t.input_schema) for t in req.tools
                                 if isinstance(t, CustomTool)), "tools[{i}].name")
    choice = _tool_choice(req, tools)
    response_format = None
    if req.output_config is not None and req.output_config.format is not None:
        response_format = ResponseFormat("json_schema", json.dumps(req.output_config.format.schema_, sort_keys=True),
                                         "output_config")
    params = SamplingParams()
    if isinstance(req, MessagesRequest):
        sampling = {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k}
        params = SamplingParams(**sampling | sampling_defaults.for_missing(req.model_fields_set),
                                max_tokens=req.max_tokens, seed=req.seed, stop=tuple(req.stop_sequences))
    budget = req.thinking.budget_tokens if req.thinking is not None and req.thinking.type == "enabled" else None
    if budget is None and req.output_config is not None:
        budget = effort_budget(req.output_config.effort)
    parallel = req.tool_choice is None or not req.tool_choice.disable_parallel_tool_use
    return ChatTurn(conversation(req), params, tools, choice, _thinking_switch(req), response_format,
                    max_tokens_given=False, thinking_budget=budget, parallel_tool_calls=parallel)


def conversation(req: CountTokensRequest) -> list[dict[str, Any]]:
    system = _system_text(req.system)
    messages = [{"role": "system", "content": system}] if system else []
    for message in req.messages:
        messages += _user_turn(message) if message.role == "user" else [_assistant_turn(message)]
    return messages


def _system_text(system: str | list[TextBlock]) -> str:
    if isinstance(system, str):
        return system
    return "\n".join(b.text for b in system if not b.text.startswith(BILLING_HEADER))


def _user_turn(message: MessageParam) -> list[dict[str, Any]]:
    """Tool results as tool messages and text as user messages, in the order the blocks come."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            text = f"Error: {block.text}" if block.is_error else block.text
            out.append({"role": "tool", "content": text, "tool_call_id": block.tool_use_id})
        elif isinstance(block, TextBlock):
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += "\n" + block.text
            else:
                out.append({"role": "user", "content": block.text})
    return out


def _assistant_turn(message: MessageParam) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    blocks = message.content
    turn: dict[str, Any] = {"role": "assistant",
                            "content": "".join(b.text for b in blocks if isinstance(b, TextBlock))}
    reasoning = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    if reasoning:
        turn["reasoning_content"] = reasoning
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
             for b in blocks if isinstance(b, ToolUseBlock)]
    if calls:
        turn["tool_calls"] = calls
    return turn


def _tool_choice(req: CountTokensRequest, tools: tuple[Tool, ...]) -> ToolChoice:
    if req.tool_choice is None:
        return ToolChoice()
    spec = req.tool_choice
    choice = ToolChoice(TOOL_CHOICES[spec.type], spec.name if spec.type == "tool" else None)
    choice.check(tools)
    return choice


def _thinking_switch(req: CountTokensRequest) -> dict[str, Any]:
    kind = None if req.thinking is None else req.thinking.type
    return {"enable_thinking": kind == "enabled"} if kind in ("enabled", "disabled") else {}
