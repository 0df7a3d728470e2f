"""Shared pieces of the serving load scripts (load.py, soak.py): the machine description every
result carries, a streaming client that times one request, and percentiles."""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "amx_tile", "amx_bf16", "amx_int8")


def machine() -> str:
    """CPU model, core count and SIMD flags (from /proc/cpuinfo), for the record."""
    model, flags = platform.processor() or "unknown CPU", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    simd = " ".join(f for f in SIMD_FLAGS if f in flags) or "none listed"
    return f"{model}; {os.cpu_count()} CPUs; SIMD flags: {simd}; load average {os.getloadavg()[0]:.2f}"


def percentile(values: list[float], q: float) -> float:
    """Nearest rank; nan for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


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
