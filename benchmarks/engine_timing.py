"""Timing engine steps, shared by the benchmark scripts: prefill steps and decode steps apart."""
from __future__ import annotations

import time

from qwen_serve import SamplingParams


def timed_run(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, int]:
    """Run the prompts to completion: (seconds of the steps that prefilled, seconds of pure
    decode steps, tokens those decode steps produced)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(f"bench-{time.monotonic_ns()}-{i}", p, params) for i, p in enumerate(prompts)]
    prefill_s = decode_s = 0.0
    decoded = 0
    while any(not s.is_finished for s in seqs):
        before = sum(len(s.output_token_ids) for s in seqs)
        prefilling = any(s.num_computed < len(s.prompt_token_ids) for s in seqs)
        t = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - t
        if prefilling:
            prefill_s += elapsed
        else:
            decode_s += elapsed
            decoded += sum(len(s.output_token_ids) for s in seqs) - before
    return prefill_s, decode_s, decoded
