"""Requests that arrive within the arrival window of each other start in the same engine step
(a burst prefills as one batch); with the window off, or where 5% of the first prompt's
estimated prefill is shorter than the gap, a later arrival waits for the next step."""
from __future__ import annotations

import asyncio
import time

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.engine.async_engine import AsyncEngine
from qwen_serve.engine.stats import RequestRecord

GAP_S = 0.05  # between the two arrivals


class Scheduled:
    """Each request's first scheduling time, as the engine thread reports it."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def on_first_token(self, record: RequestRecord) -> None:
        self.times[record.request_id] = record.scheduled_time

    def on_tokens(self, num_tokens: int, interval_s: float | None) -> None:
        pass

    def on_finished(self, record: RequestRecord) -> None:
        pass


async def _two_arrivals(engine: AsyncEngine) -> None:
    async def run(request_id: str) -> None:
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        async for _ in engine.generate(request_id, list(range(1, 40)), params, arrival_time=time.monotonic()):
            pass

    first = asyncio.create_task(run("a"))
    await asyncio.sleep(GAP_S)
    await asyncio.gather(first, run("b"))


@pytest.mark.parametrize("window_s, prefill_row_s, same_step", [
    (0.5, None, True),  # nothing measured yet: the whole window
    (0.5, 1.0, True),  # 39 tokens x 1 s x 5% > the window: the whole window
    (0.5, 1e-6, False),  # a prefill this fast is not worth waiting for
    (0.0, None, False),  # off
])
def test_a_burst_starts_in_one_step(qwen3_tiny, window_s, prefill_row_s, same_step):
    scheduled = Scheduled()
    engine = AsyncEngine(LLM(str(qwen3_tiny)).engine, observers=[scheduled], arrival_window_s=window_s)
    engine.prefill_row_s = prefill_row_s
    engine.start()
    try:
        asyncio.run(_two_arrivals(engine))
    finally:
        engine.shutdown()
    apart = abs(scheduled.times["b"] - scheduled.times["a"])
    if same_step:
        assert apart < GAP_S / 5, apart  # taken in one pass of the scheduler
    else:
        assert apart >= GAP_S * 0.8, apart  # "a" ran as soon as it came
    assert engine.prefill_row_s not in (None, prefill_row_s)  # the 39-token prefills were timed
