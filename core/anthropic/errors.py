"""Anthropic's error shape: ``{"type": "error", "error": {"type": ..., "message": ...}}``, the
type named by the status as Anthropic names it (its SDK and Claude Code read the type)."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from ..openai.bodies import json_response

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    fallback = "invalid_request_error" if status < 500 else "api_error"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, fallback), "message": message}}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(error_body(status, message), status=status, headers=headers)
