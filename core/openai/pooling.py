"""POST /v1/embeddings, /v1/rerank and /v1/score: each text is one prefill-only engine request
(batched with the others by the scheduler, prefix hits used, no KV kept after), answered with
its pooled row. Embeddings are the last token's final hidden state, L2-normalised; a rerank
or score is Qwen3-Reranker's P(yes) for a (query, document) pair."""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from typing import AsyncGenerator, Sequence

from aiohttp import web

from ..engine.outputs import RequestOutput
from ..errors import InvalidRequest
from ..pooling.reranker import RerankPrompt, relevance
from ..pooling.vectors import checked_dimensions, encoded, normalized
from .bodies import json_response, new_completion_id, now
from .pooling_protocol import parse_embedding_request, parse_rerank_request, parse_score_request
from .serving import ServedModel


class Pooling:
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def embeddings(self, request: web.Request) -> web.Response:
        served = self.served
        self._check_task("embed", "/v1/embeddings")
        req = parse_embedding_request(await request.read(), served.vocab_size)
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        dimensions = checked_dimensions(req.dimensions, served.engine.engine.model_config)
        token_lists = [served.tokenizer.encode(p) if isinstance(p, str) else p for p in req.input]
        outputs = await pooled(served, token_lists)
        data = [{"object": "embedding", "index": i,
                 "embedding": encoded(normalized(out.pooled, dimensions), req.encoding_format)}
                for i, out in enumerate(outputs)]
        tokens = sum(map(len, token_lists))
        return json_response({"object": "list", "data": data, "model": served.name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request: web.Request) -> web.Response:
        served = self.served
        self._check_task("rerank", request.path)
        req = parse_rerank_request(await request.read())
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        documents = req.texts
        scores, tokens = await self._scores([(req.query, d) for d in documents], req.instruction)
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": documents[i]}} if req.return_documents else {})} for i in ranked]
        return json_response({"id": new_completion_id("rerank"), "model": served.name, "results": results,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def score(self, request: web.Request) -> web.Response:
        served = self.served
        self._check_task("rerank", "/v1/score")
        req = parse_score_request(await request.read())
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        scores, tokens = await self._scores(req.pairs, req.instruction)
        return json_response({"id": new_completion_id("score"), "object": "list", "created": now(),
                              "model": served.name,
                              "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _scores(self, pairs: Sequence[tuple[str, str]], instruction: str | None) -> tuple[list[float], int]:
        prompt = RerankPrompt(self.served.tokenizer)
        token_lists = [prompt.tokens(query, document, instruction) for query, document in pairs]
        outputs = await pooled(self.served, token_lists)
        return [relevance(out.pooled) for out in outputs], sum(map(len, token_lists))

    def _check_task(self, task: str, route: str) -> None:
        serving = self.served.engine.engine.task
        if serving != task:
            raise InvalidRequest(f"{route} needs a server started with --task {task}; this one runs --task {serving}")


async def pooled(served: ServedModel, token_lists: Sequence[Sequence[int]]) -> list[RequestOutput]:
    """Every input's output, all queued at once so they prefill together. ``pool`` checks its
    input when called and queues it only once iterated, so every input is checked before any is
    queued (a 400 leaves nothing behind); a client that leaves aborts them all."""
    arrival = time.monotonic()
    base = uuid.uuid4().hex
    streams = [served.engine.pool(f"pool-{base}-{i}", tokens, arrival) for i, tokens in enumerate(token_lists)]
    return list(await asyncio.gather(*(_last(stream) for stream in streams)))


async def _last(outputs: AsyncGenerator[RequestOutput, None]) -> RequestOutput:
    last = None
    async with aclosing(outputs) as stream:
        async for out in stream:
            last = out
    return last
