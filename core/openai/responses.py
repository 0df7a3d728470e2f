"""OpenAI response bodies: completions, stream chunks, usage, errors, and their encodings."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web


def json_response(body: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers,
                             dumps=lambda o: json.dumps(o, ensure_ascii=False))


def sse(payload: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(completion_id: str, model: str, created: int, text: str, finish_reason: str,
                        prompt_tokens: int, completion_tokens: int, logprobs: list | None) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None if logprobs is None else {"content": logprobs},
        "finish_reason": finish_reason,
    }
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def chunk(completion_id: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None,
          logprobs: list | None = None, usage_block: dict[str, int] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    out: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": [choice]}
    if usage_block is not None:
        out["usage"] = usage_block
    return out


def now() -> int:
    return int(time.time())
