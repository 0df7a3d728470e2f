"""The sweep: for each endpoint, warm up, then for each (prompt length, output length,
concurrency) run `repetitions` closed-loop repetitions of concurrency x rounds requests, with at
most `concurrency` in flight, and summarize them."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import aiohttp
import numpy as np

from .client import Target, stream_one
from .endpoint import EndpointInfo, EndpointSpec, chat_template_tokens, describe
from .occupancy import OccupancySampler
from .prompts import TokenIdPrompts, WordPrompts, load_tokenizer
from .stats import RequestRecord, repetition, summarize

WARMUP_OUTPUT_TOKENS = 16


@dataclass(frozen=True)
class SweepPoint:
    prompt_tokens: int
    output_tokens: tuple[int, int]  # inclusive range; equal ends mean every request asks for that many
    concurrency: int

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.output_tokens
        return {"prompt_tokens": self.prompt_tokens, "output_tokens": lo if lo == hi else [lo, hi],
                "concurrency": self.concurrency}


@dataclass(frozen=True)
class RunOptions:
    repetitions: int = 3
    rounds: int = 1
    warmup: int = 1
    api: str = "auto"  # auto | chat | completions
    tokenizer: str | None = None
    length_control: str = "ignore_eos"
    sample_metrics_s: float | None = None
    seed: int = 0
    timeout_s: float = 1800.0

    def requests_per_point(self, point: SweepPoint) -> int:
        return self.repetitions * self.rounds * point.concurrency


class Prompts:
    """Exact-length prompts for one endpoint in the shape its API takes."""

    def __init__(self, api: str, seed: int, words: WordPrompts | None = None, template_tokens: int = 0) -> None:
        self.api, self.words, self.template_tokens = api, words, template_tokens
        self.ids = TokenIdPrompts(seed)

    def make(self, total_tokens: int) -> Any:
        if self.api == "completions":
            return self.ids.make(total_tokens)
        if total_tokens <= self.template_tokens:
            raise ValueError(f"a {total_tokens}-token prompt is shorter than the chat template's own "
                             f"{self.template_tokens} tokens")
        return self.words.make(total_tokens - self.template_tokens)


async def prepare(session: aiohttp.ClientSession, spec: EndpointSpec, options: RunOptions) -> tuple[EndpointInfo, Target, Prompts]:
    info = await describe(session, spec)
    api = options.api
    if api == "auto":
        api = "completions" if info.token_id_prompts else "chat"
    if api == "completions" and not info.token_id_prompts:
        raise ValueError(f"{spec.name}: /v1/completions does not take token-id prompts here; use --api chat")
    target = Target(spec.url, api, info.model, options.length_control)
    if api == "completions":
        return info, target, Prompts(api, options.seed)
    if options.tokenizer is None:
        raise ValueError(f"{spec.name}: chat prompts of an exact length need the served tokenizer: --tokenizer PATH")
    words = WordPrompts(load_tokenizer(options.tokenizer), options.seed)
    return info, target, Prompts(api, options.seed, words, await chat_template_tokens(session, target, words.make))


async def run_point(session: aiohttp.ClientSession, target: Target, prompts: Prompts, point: SweepPoint,
                    requests: int, rng: np.random.Generator, on_done: Callable[[], None],
                    sampler: OccupancySampler | None = None):
    lo, hi = point.output_tokens
    work = deque((prompts.make(point.prompt_tokens), int(rng.integers(lo, hi + 1))) for _ in range(requests))
    records: list[RequestRecord] = []

    async def stream_worker() -> None:
        while work:
            prompt, output_tokens = work.popleft()
            record = RequestRecord(point.prompt_tokens, output_tokens)
            records.append(await stream_one(session, target, prompt, record))
            on_done()

    start = time.perf_counter()
    if sampler is not None:
        sampler.start(start)
    try:
        await asyncio.gather(*(stream_worker() for _ in range(point.concurrency)))
    finally:
        if sampler is not None:
            await sampler.stop()
    return repetition(records, time.perf_counter() - start), records


async def run_endpoint(spec: EndpointSpec, points: Sequence[SweepPoint], options: RunOptions,
                       on_done: Callable[[], None], on_point: Callable[[str], None]) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=options.timeout_s)) as session:
        info, target, prompts = await prepare(session, spec, options)
        rng = np.random.default_rng(options.seed)
        widest = max(p.concurrency for p in points)
        for _ in range(options.warmup):
            on_point(f"{spec.name}: warm-up")
            warm = SweepPoint(points[0].prompt_tokens, (WARMUP_OUTPUT_TOKENS, WARMUP_OUTPUT_TOKENS), widest)
            await run_point(session, target, prompts, warm, widest, rng, lambda: None)
        results = []
        for point in points:
            on_point(f"{spec.name}: p{point.prompt_tokens} o{point.as_dict()['output_tokens']} c{point.concurrency}")
            reps, records, timeline = [], [], None
            for i in range(options.repetitions):
                sampler = None
                if options.sample_metrics_s and i == 0:
                    sampler = OccupancySampler(session, spec.url, options.sample_metrics_s)
                rep, recs = await run_point(session, target, prompts, point, point.concurrency * options.rounds,
                                            rng, on_done, sampler)
                reps.append(rep)
                records.extend(recs)
                if sampler is not None:
                    timeline = {"interval_s": options.sample_metrics_s, "samples": sampler.samples,
                                "error": sampler.error}
            summary = summarize(point.as_dict(), reps, records)
            if timeline is not None:
                summary["occupancy"] = timeline
            results.append(summary)
    return {"name": spec.name, "url": spec.url, "model": info.model, "api": target.api,
            "length_control": options.length_control, "chat_template_tokens": prompts.template_tokens,
            "identity": info.identity, "results": results}
