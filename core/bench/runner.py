"""The sweep: for each endpoint, warm up, then for each (prompt length, output length,
concurrency) run `repetitions` closed-loop repetitions of concurrency x rounds requests, with at
most `concurrency` in flight, and summarize them; endpoint after endpoint, or with the
endpoints' repetitions of each point taking turns."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import aiohttp
import numpy as np

from .client import Target, stream_one
from .endpoint import EndpointInfo, EndpointSpec, chat_template_tokens, describe
from .occupancy import OccupancySampler
from .prompts import TokenIdPrompts, WordPrompts, load_tokenizer
from .stats import Repetition, RequestRecord, repetition, summarize

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
                    sampler: OccupancySampler | None = None, clock_start: float | None = None):
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
    started_s = 0.0 if clock_start is None else start - clock_start
    return repetition(records, time.perf_counter() - start, started_s), records


class EndpointRun:
    """One endpoint's measurements: its session, prompts and random draws (seeded alike for every
    endpoint, so all of them get the same prompts and output lengths), and its repetitions so far."""

    def __init__(self, spec: EndpointSpec, options: RunOptions) -> None:
        self.spec, self.options = spec, options
        self.reps: dict[SweepPoint, list[Repetition]] = {}
        self.records: dict[SweepPoint, list[RequestRecord]] = {}
        self.timelines: dict[SweepPoint, dict[str, Any]] = {}

    async def __aenter__(self) -> "EndpointRun":
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self.session = aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=self.options.timeout_s))
        try:
            self.info, self.target, self.prompts = await prepare(self.session, self.spec, self.options)
        except BaseException:
            await self.session.close()
            raise
        self.rng = np.random.default_rng(self.options.seed)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def warm_up(self, points: Sequence[SweepPoint]) -> None:
        widest = max(p.concurrency for p in points)
        for _ in range(self.options.warmup):
            warm = SweepPoint(points[0].prompt_tokens, (WARMUP_OUTPUT_TOKENS, WARMUP_OUTPUT_TOKENS), widest)
            await run_point(self.session, self.target, self.prompts, warm, widest, self.rng, lambda: None)

    async def repeat(self, point: SweepPoint, clock_start: float, on_done: Callable[[], None]) -> None:
        """One more repetition of `point`; the first samples /metrics when asked to."""
        sampler = None
        if self.options.sample_metrics_s and point not in self.reps:
            sampler = OccupancySampler(self.session, self.spec.url, self.options.sample_metrics_s)
        rep, records = await run_point(self.session, self.target, self.prompts, point,
                                       point.concurrency * self.options.rounds, self.rng, on_done, sampler, clock_start)
        self.reps.setdefault(point, []).append(rep)
        self.records.setdefault(point, []).extend(records)
        if sampler is not None:
            self.timelines[point] = {"interval_s": self.options.sample_metrics_s, "samples": sampler.samples,
                                     "error": sampler.error}

    def result(self, points: Sequence[SweepPoint]) -> dict[str, Any]:
        results = []
        for point in points:
            summary = summarize(point.as_dict(), self.reps[point], self.records[point])
            if point in self.timelines:
                summary["occupancy"] = self.timelines[point]
            results.append(summary)
        return {"name": self.spec.name, "url": self.spec.url, "model": self.info.model, "api": self.target.api,
                "length_control": self.options.length_control, "chat_template_tokens": self.prompts.template_tokens,
                "identity": self.info.identity, "results": results}


def _label(spec: EndpointSpec, point: SweepPoint) -> str:
    return f"{spec.name}: p{point.prompt_tokens} o{point.as_dict()['output_tokens']} c{point.concurrency}"


async def run_endpoints(specs: Sequence[EndpointSpec], points: Sequence[SweepPoint], options: RunOptions,
                        on_done: Callable[[], None], on_point: Callable[[str], None],
                        interleave: bool = False) -> list[dict[str, Any]]:
    """Every endpoint over every point (each point once: results and samples are kept per point),
    endpoint after endpoint or, with `interleave`, in turns."""
    run = _in_turns if interleave else _one_after_another
    return await run(specs, points, options, on_done, on_point, time.perf_counter())


async def _one_after_another(specs, points, options, on_done, on_point, clock_start) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        async with EndpointRun(spec, options) as run:
            on_point(f"{spec.name}: warm-up")
            await run.warm_up(points)
            for point in points:
                on_point(_label(spec, point))
                for _ in range(options.repetitions):
                    await run.repeat(point, clock_start, on_done)
            out.append(run.result(points))
    return out


async def _in_turns(specs, points, options, on_done, on_point, clock_start) -> list[dict[str, Any]]:
    """Each point's repetitions take turns across the endpoints (A B, B A, A B, ...: who goes
    first alternates), so the endpoints' figures are taken seconds apart, not minutes, and a
    shared machine's slow drift in speed reaches them nearly alike. Every repetition records
    when it started."""
    async with AsyncExitStack() as stack:
        runs = [await stack.enter_async_context(EndpointRun(spec, options)) for spec in specs]
        for run in runs:
            on_point(f"{run.spec.name}: warm-up")
            await run.warm_up(points)
        for point in points:
            for i in range(options.repetitions):
                for run in (runs if i % 2 == 0 else runs[::-1]):
                    on_point(_label(run.spec, point))
                    await run.repeat(point, clock_start, on_done)
        return [run.result(points) for run in runs]
