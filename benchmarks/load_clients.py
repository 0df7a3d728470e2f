"""The streaming client of the serving load scripts (load.py, soak.py): one chat request, timed
to its first content event and to [DONE]."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Outcome:
    status: int
    ttft_s: float | None = None  # to the first content event
    e2e_s: float | None = None
    completion_tokens: int = 0
    retry_after: str | None = None
    label: str = ""


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, label: str = "") -> Outcome:
    """One streaming chat request, timed from sending to the first content event and to [DONE]."""
    start = time.monotonic()
    async with session.post(url + "/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status != 200:
            await response.read()
            return Outcome(response.status, retry_after=response.headers.get("Retry-After"), label=label)
        outcome = Outcome(200, label=label)
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                outcome.status = 599  # an error event inside a 200 stream
                break
            if outcome.ttft_s is None and event["choices"][0]["delta"].get("content"):
                outcome.ttft_s = time.monotonic() - start
            if event.get("usage"):
                outcome.completion_tokens = event["usage"]["completion_tokens"]
        outcome.e2e_s = time.monotonic() - start
        return outcome
