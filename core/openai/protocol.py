"""The OpenAI Chat Completions request schema: parse and validate a request body.

Validation is strict about types (a bool is not a number) and lenient about unknown fields, as
OpenAI clients send extras. Every rejection is an InvalidRequest naming the parameter.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..engine.sampling_params import SamplingParams
from ..errors import InvalidRequest

ROLES = ("system", "user", "assistant", "developer", "tool")
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, str]]
    params: SamplingParams
    stream: bool
    model: str | None
    priority: int = 0  # lower is served first under --scheduling-policy priority (vLLM's meaning)

    @property
    def top_logprobs(self) -> int | None:
        """How many alternatives per token; None when no logprobs were asked for."""
        return self.params.logprobs


def _number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a finite number", param=name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidRequest(f"'{name}' must be in {bracket}{low}, {high}], got {value}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{name}' must be an integer", param=name)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequest(f"'{name}' must be {limit}, got {value}", param=name)
    return value


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}", param="messages")
        out.append({"role": role, "content": _content(message.get("content"), i)})
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(f"messages[{i}].content: only text parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequest(f"messages[{i}].content must be a string or an array of text parts", param="messages")


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise InvalidRequest("'stop' must be a non-empty string or an array of up to 16 of them", param="stop")
    return tuple(stops)


def parse_chat_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    messages = _messages(body)
    n = _integer(body, "n", 1, 1)
    if n != 1:
        raise InvalidRequest("only n=1 is supported", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise InvalidRequest(f"'{name}' is not supported (only 0)", param=name)
    max_tokens = _integer(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise InvalidRequest("'logprobs' must be a boolean", param="logprobs")
    top_logprobs = _integer(body, "top_logprobs", None, 0, 20)
    if top_logprobs is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", param="model")
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
            top_k=_integer(body, "top_k", 0, 0),
            seed=_integer(body, "seed", None, -(2**63), 2**63 - 1),
            stop=_stop(body),
            max_tokens=max_tokens,
            logprobs=(top_logprobs or 0) if logprobs else None,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return ChatRequest(messages, params, stream, model, priority=_integer(body, "priority", 0, -(2**63), 2**63 - 1))
