"""Chat messages: validated strictly, then shaped the way chat templates expect them.

What a template receives matches what vLLM hands transformers: text content as one string (an
assistant turn that only calls tools gets ""), ``developer`` turns as ``system``, and each
tool call's ``arguments`` parsed from the JSON string of the request into a mapping (Qwen3's
template prints a mapping with ``tojson`` and a string as is; other templates iterate it).
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from .fields import load_json, string

ROLES = ("system", "user", "assistant", "developer", "tool")


def parse_messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(value)]


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"'{where}.role' must be one of {', '.join(ROLES)}", param=f"{where}.role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    tool_calls = _tool_calls(message.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else None
    if role != "assistant" and message.get("tool_calls") is not None:
        raise InvalidRequest(f"'{where}.tool_calls' is only allowed on assistant messages", param=f"{where}.tool_calls")
    content = message.get("content")
    if content is None and role == "assistant" and tool_calls:
        out["content"] = ""
    else:
        out["content"] = text_content(content, f"{where}.content")
    if tool_calls:
        out["tool_calls"] = tool_calls
    name = string(message, "name", where)
    if name is not None:
        out["name"] = name
    if role == "assistant":
        reasoning = string(message, "reasoning_content", where)
        if reasoning is not None:
            out["reasoning_content"] = reasoning
    if role == "tool":
        out["tool_call_id"] = string(message, "tool_call_id", where, required=True)
    return out


def text_content(content: Any, field: str) -> str:
    """A string, or an array of text parts joined into one."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(f"'{field}': only text parts are supported", param=field)
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequest(f"'{field}' must be a string or an array of text parts", param=field)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest(f"'{where}' must be an array", param=where)
    return [_tool_call(call, f"{where}[{i}]") for i, call in enumerate(value)]


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    call_id = string(call, "id", where, required=True)
    if call.get("type") not in (None, "function"):
        raise InvalidRequest(f"'{where}.type' must be \"function\"", param=f"{where}.type")
    function = call.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"'{where}.function' must be an object", param=f"{where}.function")
    name = string(function, "name", f"{where}.function", required=True)
    if not name:
        raise InvalidRequest(f"'{where}.function.name' must not be empty", param=f"{where}.function.name")
    arguments_text = string(function, "arguments", f"{where}.function", required=True)
    field = f"{where}.function.arguments"
    try:
        arguments = load_json(arguments_text, f"'{field}'", param=field)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"'{field}' must be a JSON object as a string ({exc.msg})", param=field) from None
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"'{field}' must be a JSON object as a string", param=field)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
