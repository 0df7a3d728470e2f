"""OpenAI response bodies: chat completions and their stream chunks, legacy text completions
and theirs, usage, and errors."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web


def json_response(body: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers, dumps=to_json)


def to_json(body: Any, separators: tuple[str, str] | None = None) -> str:
    """JSON whose UTF-8 always encodes: escaped to ASCII when the body holds a lone surrogate
    (a client can send one; an error message or a request echo repeats it)."""
    text = json.dumps(body, ensure_ascii=False, separators=separators)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=separators)
    return text


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def model_not_found(requested: str, served: str) -> web.Response:
    return json_response(error_body(f"model {requested!r} is not served here (this server serves {served!r})",
                                    param="model", code="model_not_found"), status=404)


def new_completion_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


# --- chat completions ---------------------------------------------------------------------
def chat_completion(completion_id: str, model: str, created: int, choices: list[dict[str, Any]],
                    usage_block: dict[str, Any]) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage_block}


def chat_choice(index: int, message: dict[str, Any], finish_reason: str, logprobs: list | None) -> dict[str, Any]:
    return {"index": index, "message": message,
            "logprobs": None if logprobs is None else {"content": logprobs}, "finish_reason": finish_reason}


def chat_chunk(completion_id: str, model: str, created: int, choices: list[dict[str, Any]],
               usage_block: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": choices}
    if usage_block is not None:
        out["usage"] = usage_block
    return out


def delta_choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                 logprobs: list | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return choice


# --- legacy completions -------------------------------------------------------------------
def text_completion(completion_id: str, model: str, created: int, choices: list[dict[str, Any]],
                    usage_block: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole reply, and (with one choice) each stream chunk: the legacy API uses one shape."""
    out: dict[str, Any] = {"id": completion_id, "object": "text_completion", "created": created, "model": model,
                           "choices": choices}
    if usage_block is not None:
        out["usage"] = usage_block
    return out


def text_choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
