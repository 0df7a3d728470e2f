"""API keys (--api-key, QWEN_SERVE_API_KEY): `Authorization: Bearer KEY` (or Anthropic's
`x-api-key: KEY`) on every route but the open ones, compared in constant time; otherwise a 401
in the error shape of the route's API."""
from __future__ import annotations

import hmac
import ipaddress
from typing import Container, Iterable, Mapping

from aiohttp import web

from .error_replies import error_reply

ENV_VAR = "QWEN_SERVE_API_KEY"  # one key, or several separated by commas


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(dict.fromkeys(k.encode() for k in keys if k))

    def __bool__(self) -> bool:
        return bool(self._keys)

    def accepts_request(self, headers: Mapping[str, str]) -> bool:
        """A key as a Bearer token (OpenAI's clients) or in x-api-key (Anthropic's)."""
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            return self.accepts(token.strip())
        return "x-api-key" in headers and self.accepts(headers["x-api-key"].strip())

    def accepts(self, key: str) -> bool:
        presented = key.encode()
        matched = False
        for key in self._keys:  # every key is compared, so the time says nothing about which matched
            matched |= hmac.compare_digest(presented, key)
        return matched


def keys_from(flags: Iterable[str] | None, env_value: str | None) -> ApiKeys:
    from_env = [k.strip() for k in (env_value or "").split(",")]
    return ApiKeys([*(flags or ()), *from_env])


def require_api_key(keys: ApiKeys, open_paths: Container[str]):
    """Middleware: without keys, everything is open."""

    @web.middleware
    async def authenticate(request: web.Request, handler) -> web.StreamResponse:
        if not keys or request.path in open_paths or keys.accepts_request(request.headers):
            return await handler(request)
        return error_reply(request, 401, "missing or incorrect API key: send 'Authorization: Bearer <key>' "
                           "(or 'x-api-key: <key>')", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return authenticate


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: assume it reaches beyond this machine
        return False
