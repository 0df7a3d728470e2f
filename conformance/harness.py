"""Driving an engine request by request, with the timings the checks measure."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Sequence

from qwen_serve import LLM, SamplingParams

_ids = itertools.count()


@dataclass
class Run:
    token_ids: list[int]
    text: str
    ttft_s: float
    prefill_tokens: int


def run_alone(llm: LLM, prompt: Sequence[int], params: SamplingParams) -> Run:
    """One request on an idle engine: its TTFT and how many prompt tokens it computed."""
    engine = llm.engine
    assert not engine.has_unfinished(), "run_alone needs an idle engine"
    before = engine.stats.prefill_tokens_total
    seq = engine.add_request(f"conformance-{next(_ids)}", prompt, params, arrival_time=time.monotonic())
    while not seq.is_finished:
        engine.step()
    return Run(list(seq.output_token_ids), seq.detokenizer.text, seq.first_token_time - seq.arrival_time,
               engine.stats.prefill_tokens_total - before)


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result
