"""What an endpoint is and what it accepts, found by asking it: the model it serves, its own
description of itself (qwen-serve /health, llama.cpp /props, vLLM /version), whether
/v1/completions takes token-id prompts, and how many tokens its chat template adds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .client import Target, request_json

IDENTITY_PATHS = ("/health", "/props", "/version", "/v1/models")
DROP_KEYS = ("chat_template", "chat_template_tool_use")  # llama.cpp's /props: kilobytes of template text


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    url: str

    @classmethod
    def parse(cls, text: str) -> "EndpointSpec":
        """NAME=URL, or a bare URL (then the name is host:port)."""
        name, sep, url = text.partition("=")
        if not sep or "://" in name:
            name, url = "", text
        if "://" not in url:
            raise ValueError(f"--endpoint {text!r}: expected NAME=http://HOST:PORT")
        url = url.rstrip("/").removesuffix("/v1")
        return cls(name or url.split("://", 1)[1], url)


@dataclass
class EndpointInfo:
    spec: EndpointSpec
    model: str | None
    identity: dict[str, Any] = field(default_factory=dict)
    token_id_prompts: bool = False


def _trim(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items() if k not in DROP_KEYS}
    return value


async def describe(session: aiohttp.ClientSession, spec: EndpointSpec) -> EndpointInfo:
    identity = {}
    for path in IDENTITY_PATHS:
        status, body = await request_json(session, "GET", spec.url + path, timeout_s=10)
        if status == 200 and isinstance(body, dict):
            identity[path] = _trim(body)
    models = identity.get("/v1/models", {}).get("data") or []
    if not identity:
        raise ConnectionError(f"{spec.name}: {spec.url} does not answer (GET /health, /v1/models)")
    info = EndpointInfo(spec, models[0].get("id") if models else None, identity)
    info.token_id_prompts = await accepts_token_ids(session, Target(spec.url, "completions", info.model))
    return info


async def accepts_token_ids(session: aiohttp.ClientSession, target: Target) -> bool:
    """True if /v1/completions takes a list of token ids as the prompt and counts them right."""
    ids = [1000, 2000, 3000, 4000, 5000]
    status, body = await request_json(session, "POST", target.url + target.path(),
                                      target.body(ids, 1, stream=False), timeout_s=120)
    return status == 200 and isinstance(body, dict) and (body.get("usage") or {}).get("prompt_tokens") == len(ids)


async def chat_template_tokens(session: aiohttp.ClientSession, target: Target, text_of_n_tokens, n: int = 10) -> int:
    """Prompt tokens the chat template adds around a user message of n tokens (from usage)."""
    counts = []
    for size in (n, 2 * n):
        status, body = await request_json(session, "POST", target.url + target.path(),
                                          target.body(text_of_n_tokens(size), 1, stream=False), timeout_s=120)
        usage = (body.get("usage") if isinstance(body, dict) else None) or {}
        if status != 200 or "prompt_tokens" not in usage:
            raise ValueError(f"{target.url}: a chat request gave no usage.prompt_tokens (HTTP {status}: {str(body)[:200]})")
        counts.append(usage["prompt_tokens"] - size)
    if counts[0] != counts[1]:
        raise ValueError(f"{target.url}: the served tokenizer counts the words differently from --tokenizer "
                         f"(template overhead {counts[0]} vs {counts[1]} tokens)")
    return counts[0]
