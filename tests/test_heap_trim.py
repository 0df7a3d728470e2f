"""The engine thread hands the freed heap back to the OS once it has been idle after work: not
while it serves, not over and over while nothing happens."""
from __future__ import annotations

import asyncio
import time

from qwen_serve import LLM, SamplingParams
from qwen_serve.engine import async_engine
from qwen_serve.engine.async_engine import AsyncEngine
from qwen_serve.heap import return_free_heap


def test_the_heap_is_trimmed_once_per_idle_period_after_work(qwen3_tiny, monkeypatch):
    monkeypatch.setattr(async_engine, "IDLE_TRIM_S", 0.2)
    inner = LLM(str(qwen3_tiny)).engine
    trims: list[tuple[float, bool]] = []
    engine = AsyncEngine(inner, trim_heap=lambda: trims.append((time.monotonic(), inner.has_unfinished())))
    engine.start()

    async def one(request_id: str) -> float:
        async for out in engine.generate(request_id, [1, 2, 3, 4], SamplingParams(max_tokens=8, ignore_eos=True),
                                         arrival_time=time.monotonic()):
            if out.finished:
                return time.monotonic()

    try:
        time.sleep(0.6)
        assert trims == []  # idle before any work: nothing to give back
        first_done = asyncio.run(one("a"))
        time.sleep(1.0)
        assert len(trims) == 1 and trims[0][0] >= first_done and not trims[0][1]
        asyncio.run(one("b"))
        time.sleep(1.0)
        assert len(trims) == 2
    finally:
        engine.shutdown()


def test_trimming_works_on_this_c_library():
    assert return_free_heap() is True  # glibc: the Linux machines this runs on
