"""Error replies in the shape of the API a request was sent to: Anthropic's under
/v1/messages (its SDK and Claude Code read only that shape), OpenAI's everywhere else. Every
gate in front of the handlers (API keys, the lifecycle, admission) and the error middleware
answer through here, so a client never gets an error it cannot read."""
from __future__ import annotations

from aiohttp import web

from ..anthropic import errors as anthropic_errors
from ..openai.bodies import error_body, json_response

ANTHROPIC_PREFIX = "/v1/messages"


def error_reply(request: web.Request, status: int, message: str, type_: str = "invalid_request_error",
                param: str | None = None, code: str | None = None,
                headers: dict[str, str] | None = None) -> web.Response:
    """type_, param and code are OpenAI's fields; Anthropic's shape names the type by status,
    and has no param: its message names the field instead."""
    if request.path.startswith(ANTHROPIC_PREFIX):
        named = message if param is None or param in message else f"'{param}': {message}"
        return anthropic_errors.error_response(status, named, headers)
    return json_response(error_body(message, type_, param, code), status=status, headers=headers)
