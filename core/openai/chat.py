"""POST /v1/chat/completions: render the conversation, run it, answer as JSON or as SSE.

A request with n choices gets outputs for indexes 0..n-1 interleaved; each choice has its own
parser state, and the reply is done when every choice has finished. The JSON reply parses each
choice's whole text; the stream parses it delta by delta with the same state machines, so the
joined deltas equal the JSON message.
"""
from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any, Callable

from aiohttp import web

from ..chat.output_parser import ChatOutputParser, MessageDelta
from ..checkpoints.tokenizer import Tokenizer
from ..engine.outputs import RequestOutput
from .bodies import chat_choice, chat_chunk, chat_completion, delta_choice, new_completion_id
from .logprobs import chat_logprob_entry
from .protocol import parse_chat_request
from .serving import ChunkWriter, ReplyTally, ServedModel, answer_json, answer_stream
from .turn import start_turn


class ChatCompletions:
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        served = self.served
        req = parse_chat_request(await request.read(), served.vocab_size, served.sampling_defaults)
        refusal = served.refuse_model(req.model)
        if refusal is not None:
            return refusal
        turn = start_turn(served, req.turn, new_completion_id(), arrival)
        tally = ReplyTally(turn.reply_id, turn.params.n, len(turn.rendered.token_ids), arrival)
        choices = [_Choice(i, turn.new_parser, served.tokenizer, turn.params.logprobs) for i in range(turn.params.n)]
        async with aclosing(turn.outputs) as outputs:
            keyed = ((out.index, out, 0) async for out in outputs)
            if req.stream:
                return await answer_stream(served, request, keyed, tally, ChunkWriter(
                    tally, choices, req.include_usage,
                    lambda bodies, usage: chat_chunk(tally.id, served.name, tally.created, bodies, usage),
                    opening=[delta_choice(c.index, {"role": "assistant"}) for c in choices]))
            return await answer_json(served, keyed, tally, choices, lambda bodies, usage: chat_completion(
                tally.id, served.name, tally.created, bodies, usage))


class _Choice:
    """One choice of a chat reply: its text so far, logprobs, and its streaming parser."""

    def __init__(self, index: int, new_parser: Callable[[], ChatOutputParser], tokenizer: Tokenizer,
                 top_logprobs: int | None) -> None:
        self.index = index
        self._new_parser = new_parser
        self._stream_parser: ChatOutputParser | None = None
        self._tokenizer = tokenizer
        self._top_logprobs = top_logprobs
        self._texts: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._engine_reason = "stop"
        self._calls_streamed = 0

    def record(self, out: RequestOutput) -> list[dict[str, Any]] | None:
        """Takes an output; returns its tokens' logprob entries (None when none were asked for)."""
        self._texts.append(out.new_text)
        if out.finished:
            self._engine_reason = out.finish_reason or "stop"
        if self._top_logprobs is None:
            return None
        entries = [chat_logprob_entry(self._tokenizer, tok, lp or {}, self._top_logprobs)
                   for tok, lp in zip(out.new_token_ids, out.new_logprobs)]
        self._logprobs.extend(entries)
        return entries

    def json_choice(self) -> dict[str, Any]:
        message = self._new_parser().parse("".join(self._texts))
        return chat_choice(self.index, message.as_openai(), self._reason(bool(message.tool_calls)),
                           self._logprobs if self._top_logprobs is not None else None)

    def stream(self, out: RequestOutput) -> dict[str, Any] | None:
        """The chunk choice this output makes: its delta (reasoning, content, whole tool calls)
        and its logprobs; None when it makes neither."""
        logprobs = self.record(out)
        if self._stream_parser is None:
            self._stream_parser = self._new_parser()
        found = self._stream_parser.feed(out.new_text)
        if out.finished:
            found = found + self._stream_parser.finish()
        delta = self._delta(found)
        return delta_choice(self.index, delta, logprobs=logprobs) if delta or logprobs else None

    def finish_chunk(self) -> dict[str, Any]:
        return delta_choice(self.index, {}, self._reason(self._calls_streamed > 0))

    def _delta(self, found: MessageDelta) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if found.reasoning:
            delta["reasoning_content"] = found.reasoning
        if found.content:
            delta["content"] = found.content
        if found.tool_calls:
            delta["tool_calls"] = [{"index": self._calls_streamed + k, **call.as_openai()}
                                   for k, call in enumerate(found.tool_calls)]
            self._calls_streamed += len(found.tool_calls)
        return delta

    def _reason(self, called_tools: bool) -> str:
        return "tool_calls" if called_tools and self._engine_reason == "stop" else self._engine_reason
