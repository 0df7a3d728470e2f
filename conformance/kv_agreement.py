"""How close a lossy KV cache keeps the model to the exact cache it approximates (check 2 for
LossyKV caches; also tests/test_int8_kv.py).

Both engines see the same contexts: each prompt followed by the exact cache's own greedy answer
(teacher forcing), run as the engine runs them (prefix hits, prefill in chunks of the engine's
chunk size, then one decode step per token), so every position after the prompt reads keys and
values the cache stored earlier. The measure is the share of positions whose top-1 token agrees
and the largest absolute logit difference over every position and vocabulary entry.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from qwen_serve import LLM, SamplingParams
from qwen_serve.protocols import PrefixCaching, ScheduledChunk, StepBatch

_ids = itertools.count(1)
# The bound a lossy cache must keep (measured with the int8 cache on check 2's prompts: SmolLM2
# 99.0% top-1, max |Δlogit| 0.98 = 2.4% of the logit span; random Qwen3 97.9%, 0.13 = 0.9%). A
# 6-bit quantizer (31 levels) already leaves SmolLM2 at 12% of the span and a 4-bit one drops
# top-1 to 67-73%, so the bound tells int8 from coarser formats with a 2x margin.
MIN_TOP1 = 0.90
MAX_DELTA_OF_SPREAD = 0.05


@dataclass(frozen=True)
class LogitAgreement:
    top1: float  # share of positions where both caches' most likely token is the same
    max_abs_delta: float  # largest |logit difference| over all positions and tokens
    logit_spread: float  # mean over positions of the exact logits' max - min, for scale
    positions: int

    @property
    def within_bound(self) -> bool:
        return self.top1 >= MIN_TOP1 and self.max_abs_delta <= MAX_DELTA_OF_SPREAD * self.logit_spread

    def describe(self) -> str:
        return (f"top-1 agreement {self.top1:.1%} over {self.positions} positions, max |Δlogit| "
                f"{self.max_abs_delta:.3f} (logits span {self.logit_spread:.1f})")


def teacher_forced_logits(llm: LLM, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """[len(continuation) + 1, vocab] float32: the next-token logits after the prompt and after
    each continuation token, through llm's own executor and cache (on an idle engine)."""
    assert not llm.engine.has_unfinished(), "teacher_forced_logits needs an idle engine"
    cache, executor = llm.parts.cache, llm.parts.executor
    chunk_size = llm.parts.engine_config.chunk_size
    seq_id = -next(_ids)  # the engine numbers its sequences from 0 up
    tokens = list(prompt)
    rows = []

    def run(start: int, stop: int, sample: bool) -> None:
        if not cache.allocate_slots(seq_id, start, stop - start):
            raise RuntimeError(f"no KV room for positions {start}..{stop - 1}")
        chunk = ScheduledChunk(seq_id, tokens[start:stop], start, sample)
        logits = executor.execute(StepBatch((chunk,)), cache)
        if isinstance(cache, PrefixCaching):
            cache.publish(seq_id, tokens, stop)
        if sample:
            rows.append(np.asarray(logits)[0].astype(np.float32))

    try:
        start = cache.match_prefix(seq_id, tokens) if isinstance(cache, PrefixCaching) else 0
        for chunk_start in range(start, len(tokens), chunk_size):
            stop = min(chunk_start + chunk_size, len(tokens))
            run(chunk_start, stop, sample=stop == len(tokens))
        for token in continuation:
            tokens.append(token)
            run(len(tokens) - 1, len(tokens), sample=True)
    finally:
        cache.free(seq_id)
    return np.stack(rows)


def logit_agreement(exact: LLM, lossy: LLM, prompts: list[list[int]], new_tokens: int) -> LogitAgreement:
    answers = exact.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
    agree, deltas, spreads = [], [], []
    for prompt, answer in zip(prompts, answers):
        reference = teacher_forced_logits(exact, prompt, answer.token_ids[:-1])
        approximate = teacher_forced_logits(lossy, prompt, answer.token_ids[:-1])
        agree.extend(reference.argmax(-1) == approximate.argmax(-1))
        deltas.append(float(np.abs(reference - approximate).max()))
        spreads.extend(reference.max(-1) - reference.min(-1))
    return LogitAgreement(float(np.mean(agree)), max(deltas), float(np.mean(spreads)), len(agree))
