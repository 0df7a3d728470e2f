"""One streamed request over HTTP (aiohttp), timed at the client as each SSE event arrives.

aiohttp rather than the openai client: it is already the server's dependency, and per chunk it
costs the client less CPU (benchmarks/bench_client_overhead.py), which matters when client and
server share two cores.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .sse import SSEParser, content_of
from .stats import RequestRecord

LENGTH_CONTROLS = ("ignore_eos", "min_tokens", "both", "none")


@dataclass(frozen=True)
class Target:
    """Where and how to send: base URL (no /v1), the API shape, the model name to ask for."""

    url: str
    api: str  # "chat" | "completions"
    model: str | None
    length_control: str = "ignore_eos"

    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def body(self, prompt: Any, max_tokens: int, stream: bool = True) -> dict[str, Any]:
        """prompt: a string (chat: the user message) or token ids (completions)."""
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.model:
            body["model"] = self.model
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.length_control in ("ignore_eos", "both"):
            body["ignore_eos"] = True
        if self.length_control in ("min_tokens", "both"):
            body["min_tokens"] = max_tokens
        return body


async def stream_one(session: aiohttp.ClientSession, target: Target, prompt: Any, record: RequestRecord,
                     clock=time.perf_counter) -> RequestRecord:
    """Send one streaming request and fill `record`; failures land in record.error, never raise."""
    body = target.body(prompt, record.output_tokens_asked)
    record.sent = clock()
    parser = SSEParser()
    try:
        async with session.post(target.url + target.path(), json=body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:300]}"
                return record
            async for data in response.content.iter_any():
                arrived = clock()
                if _take(parser.feed(data, arrived), record):
                    break
            else:
                _take(parser.close(clock()), record)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    if record.error is None and not record.chunk_times:
        record.error = "the stream carried no generated text"
    if record.output_tokens is None:  # no usage in the stream: one token per content event
        record.output_tokens = len(record.chunk_times)
    return record


def _take(events, record: RequestRecord) -> bool:
    """Apply events to the record; True once [DONE] arrived."""
    for event in events:
        if event.done:
            return True
        payload = event.json()
        if "error" in payload:
            record.error = str(payload["error"].get("message", payload["error"]))[:300]
            continue
        usage = payload.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
            record.output_tokens = usage.get("completion_tokens")
        if content_of(payload):
            record.chunk_times.append(event.arrived - record.sent)
        for choice in payload.get("choices") or []:
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
    return False


async def request_json(session: aiohttp.ClientSession, method: str, url: str, body: dict | None = None,
                       timeout_s: float = 30.0) -> tuple[int, Any]:
    """(status, parsed JSON or text); (0, message) when the server does not answer."""
    try:
        async with session.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
