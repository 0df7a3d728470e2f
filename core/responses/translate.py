"""A Responses request as the ChatTurn every chat-shaped API runs as.

Items become the message shape chat templates take: ``instructions`` the first system message,
``developer`` messages system ones, a run of assistant-side items (reasoning, an assistant
message, function calls) one assistant turn with its ``reasoning_content`` and ``tool_calls``,
each ``function_call_output`` a ``tool`` message. ``reasoning.effort`` none / minimal turn
Qwen's thinking off, the other efforts on; ``text.format`` is the response format.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from ..chat.reasoning.effort import effort_budget, effort_template_kwargs
from ..chat.tools import ToolChoice, distinct_names, function_tool
from ..openai.structured import ResponseFormat
from ..openai.turn import ChatTurn
from ..sampling.defaults import SamplingDefaults
from ..sampling.params import SamplingParams
from .encrypted import unseal
from .protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolSpec,
    InputMessageItem,
    JsonObjectOutput,
    JsonSchemaTextOutput,
    ReasoningItem,
    ResponsesRequest,
    joined_text,
)

UNLIMITED = 2**31 - 1  # an omitted max_output_tokens: start_turn cuts it to the room the prompt leaves


def chat_turn(req: ResponsesRequest, items: Sequence[Any],
              sampling_defaults: SamplingDefaults = SamplingDefaults()) -> ChatTurn:
    """The turn of ``req`` over ``items``: the stored conversation it continues, then its input
    (the model's defaults for the sampling fields it leaves out)."""
    tools = distinct_names(tuple(function_tool(t.name, t.description, t.parameters) for t in req.tools
                                 if isinstance(t, FunctionToolSpec)), "tools[{i}].name")
    choice = tool_choice(req)
    choice.check(tools)
    sampling = {"temperature": req.temperature, "top_p": req.top_p} | sampling_defaults.for_missing(req.model_fields_set)
    params = SamplingParams(max_tokens=req.max_output_tokens or UNLIMITED, seed=req.seed, **sampling)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return ChatTurn(system + conversation(items), params, tools, choice, effort_template_kwargs(req.reasoning.effort),
                    response_format(req), max_tokens_given=False, thinking_budget=effort_budget(req.reasoning.effort),
                    parallel_tool_calls=req.parallel_tool_calls)


def tool_choice(req: ResponsesRequest) -> ToolChoice:
    choice = req.tool_choice
    return ToolChoice(choice) if isinstance(choice, str) else ToolChoice("function", choice.name)


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format
    if isinstance(fmt, JsonSchemaTextOutput):
        return ResponseFormat("json_schema", json.dumps(fmt.schema_, sort_keys=True), "text")
    return ResponseFormat("json_object", None, "text") if isinstance(fmt, JsonObjectOutput) else None


def conversation(items: Sequence[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, InputMessageItem) and item.role != "assistant":
            role = "user" if item.role == "user" else "system"
            messages.append({"role": role, "content": joined_text(item.content)})
        elif isinstance(item, InputMessageItem):
            _assistant_turn(messages)["content"] += joined_text(item.content)
        elif isinstance(item, FunctionCallItem):
            _assistant_turn(messages).setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function",
                 "function": {"name": item.name, "arguments": json.loads(item.arguments)}})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": joined_text(item.output)})
        elif isinstance(item, ReasoningItem):
            reasoning = "".join(p.text for p in item.content) or unseal(item.encrypted_content or "")
            if reasoning:
                turn = _assistant_turn(messages, after_reply=True)
                turn["reasoning_content"] = turn.get("reasoning_content", "") + reasoning
    return messages


def _assistant_turn(messages: list[dict[str, Any]], after_reply: bool = False) -> dict[str, Any]:
    """The assistant turn the next assistant-side item belongs to: the last message if it is one
    (unless after_reply and it has replied already: reasoning starts a turn), else a new one."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant" or (after_reply and (last["content"] or "tool_calls" in last)):
        last = {"role": "assistant", "content": ""}
        messages.append(last)
    return last

