"""POST /v1/completions, OpenAI's legacy text completions: a prompt as text or token ids (or a
list of either), n choices each, JSON or SSE, and logprobs in the legacy shape.

Each prompt is its own engine request, all running at once; choice i of prompt p is choice
``p * n + i`` of the reply, as in OpenAI's API. ``echo`` and ``suffix`` are refused (400).
"""
from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

from aiohttp import web

from ..checkpoints.tokenizer import Tokenizer
from ..engine.outputs import RequestOutput
from .bodies import new_completion_id, text_choice, text_completion
from .logprobs import LegacyLogprobs
from .protocol import parse_completion_request
from .serving import ChunkWriter, ReplyTally, ServedModel, answer_json, answer_stream
from .streaming import merge_streams


class Completions:
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        served = self.served
        req = parse_completion_request(await request.read(), served.vocab_size, served.sampling_defaults)
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        prompts = [served.tokenizer.encode(p) if isinstance(p, str) else p for p in req.prompt]
        n = req.params.n
        tally = ReplyTally(new_completion_id("cmpl"), len(prompts) * n, sum(len(p) for p in prompts), arrival)
        # Every prompt is validated before any of them is queued.
        streams = [served.engine.generate(f"{tally.id}-{i}", p,
                                          served.fit_default_max_tokens(req.params, len(p), req.max_tokens_given),
                                          arrival, priority=req.priority) for i, p in enumerate(prompts)]
        served.metrics.record_request()
        choices = [_TextChoice(i, served.tokenizer, req.params.logprobs) for i in range(len(prompts) * n)]

        def body(choice_bodies: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
            return text_completion(tally.id, served.name, tally.created, choice_bodies, usage)

        async with aclosing(merge_streams(streams)) as outputs:
            keyed = ((prompt * n + out.index, out, prompt) async for prompt, out in outputs)
            if req.stream:
                return await answer_stream(served, request, keyed, tally,
                                           ChunkWriter(tally, choices, req.include_usage, body))
            return await answer_json(served, keyed, tally, choices, body)


class _TextChoice:
    def __init__(self, index: int, tokenizer: Tokenizer, logprobs: int | None) -> None:
        self.index = index
        self._texts: list[str] = []
        self._logprobs = None if logprobs is None else LegacyLogprobs(tokenizer, logprobs)
        self.finish_reason = "stop"

    def record(self, out: RequestOutput) -> dict[str, list] | None:
        """Takes an output; returns its tokens' legacy logprobs (None when none were asked for)."""
        self._texts.append(out.new_text)
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
        if self._logprobs is None:
            return None
        return self._logprobs.add(out.new_token_ids, out.new_logprobs)

    def stream(self, out: RequestOutput) -> dict[str, Any] | None:
        logprobs = self.record(out)
        return text_choice(self.index, out.new_text, None, logprobs) if out.new_text or logprobs else None

    def finish_chunk(self) -> dict[str, Any]:
        return text_choice(self.index, "", self.finish_reason, None)

    def json_choice(self) -> dict[str, Any]:
        logprobs = None if self._logprobs is None else self._logprobs.body
        return text_choice(self.index, "".join(self._texts), self.finish_reason, logprobs)
