"""What every endpoint handler is given (the served model and its parts), and what the
generating endpoints share: the bookkeeping of a reply (tokens, timings, which choices have
finished) and the two ways to answer, JSON or SSE, over choices each endpoint shapes its own way.
"""
from __future__ import annotations

import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from aiohttp import web

from ..chat.format import ChatFormat
from ..checkpoints.tokenizer import Tokenizer
from ..engine.client import EngineClient
from ..engine.failures import EngineFailure
from ..engine.outputs import RequestOutput
from ..sampling.defaults import SamplingDefaults
from ..sampling.params import SamplingParams
from .bodies import error_body, json_response, model_not_found, now, usage
from .streaming import DONE, EventStream, sse


@dataclass(frozen=True)
class ServedModel:
    engine: EngineClient  # AsyncEngine in process, or qwen_serve.cluster's client of Ray replicas
    tokenizer: Tokenizer
    chat_format: ChatFormat
    name: str
    serves: Callable[[str], bool]
    metrics: Any  # qwen_serve.server.metrics.ServerMetrics
    keepalive_s: float = 5.0  # an SSE comment after this long without an event; 0: never
    write_timeout_s: float | None = None  # a client that takes longer to take one event is cut off
    sampling_defaults: SamplingDefaults = SamplingDefaults()  # for the sampling fields a request leaves out
    reasoning_budget: int | None = None  # tokens a think block may take unless a request says (None: no cap)

    @property
    def vocab_size(self) -> int:
        return self.engine.engine.model_config.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.engine.engine.max_seq_len

    def fit_default_max_tokens(self, params: SamplingParams, prompt_len: int,
                               max_tokens_given: bool) -> SamplingParams:
        """An omitted max_tokens is its default or the room the prompt leaves under max_seq_len,
        whichever is less (as in vLLM): only a max_tokens the client asked for is refused for
        not fitting."""
        room = self.max_seq_len - prompt_len
        if max_tokens_given or params.max_tokens <= room or room < max(1, params.min_tokens):
            return params
        return replace(params, max_tokens=room)

    def refuse_model(self, requested: str | None) -> web.Response | None:
        """A 404 when the request names a model this server does not serve."""
        if requested is None or self.serves(requested):
            return None
        return model_not_found(requested, self.name)

    def record_finished(self, tally: "ReplyTally") -> None:
        ttft = None if tally.first_token_at is None else tally.first_token_at - tally.arrival
        decode = 0.0 if tally.first_token_at is None else tally.last_token_at - tally.first_token_at
        self.metrics.record_latency(ttft, decode, tally.completion_tokens)


class ReplyTally:
    """One reply, over all its choices (and, for legacy completions, all its prompts)."""

    def __init__(self, reply_id: str, num_choices: int, prompt_tokens: int, arrival: float) -> None:
        self.id = reply_id
        self.created = now()
        self.num_choices = num_choices
        self.prompt_tokens = prompt_tokens
        self.arrival = arrival
        self.completion_tokens = 0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.finish_reasons: dict[int, str] = {}  # choice index -> the engine's reason
        self._cached_tokens: dict[int, int] = {}  # engine request -> prompt tokens from the prefix cache

    def record(self, out: RequestOutput, choice: int, request: int = 0) -> None:
        t = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = t
        self.last_token_at = t
        self.completion_tokens += len(out.new_token_ids)
        self._cached_tokens[request] = max(self._cached_tokens.get(request, 0), out.num_cached_tokens)
        if out.finished:
            self.finish_reasons[choice] = out.finish_reason or "stop"

    @property
    def done(self) -> bool:
        return len(self.finish_reasons) == self.num_choices

    @property
    def failed(self) -> bool:
        return "error" in self.finish_reasons.values()

    @property
    def cached_tokens(self) -> int:
        return sum(self._cached_tokens.values())

    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


class StreamedChoice(Protocol):
    """One choice of a reply, as the chat and the legacy completions handlers keep it."""

    index: int

    def record(self, out: RequestOutput) -> None:
        """Take an output (a reply answered as JSON)."""

    def stream(self, out: RequestOutput) -> dict[str, Any] | None:
        """Take an output; the chunk choice it makes, if any (a reply answered as SSE)."""

    def finish_chunk(self) -> dict[str, Any]:
        """The chunk choice that carries this choice's finish_reason."""

    def json_choice(self) -> dict[str, Any]: ...


class OneChoice:
    """A one-choice reply (Messages, Responses) as answer_json collects it: each output goes to
    ``take``, and ``body`` makes the reply's body once every output is in."""

    index = 0

    def __init__(self, take: Callable[[RequestOutput], Any], body: Callable[[], dict[str, Any]]) -> None:
        self._take = take
        self._body = body

    def record(self, out: RequestOutput) -> None:
        self._take(out)

    def json_choice(self) -> dict[str, Any]:
        return self._body()


class StreamWriter(Protocol):
    """How one API writes a reply as Server-Sent Events; answer_stream drives it."""

    def opening(self) -> bytes:
        """The events that open the stream (sent with the first event after them)."""

    def events(self, index: int, out: RequestOutput) -> list[bytes]:
        """The events an output of choice ``index`` makes (an output ending in an engine error
        makes its text's events only: ``error`` follows)."""

    def closing(self) -> list[bytes]:
        """The events after every choice has finished, the API's end marker among them."""

    def error(self, message: str) -> list[bytes]:
        """The events that end a stream the engine failed after it opened."""


# (choice index, output, engine request number) as outputs arrive
Outputs = AsyncIterator[tuple[int, RequestOutput, int]]


async def answer_json(served: ServedModel, outputs: Outputs, tally: ReplyTally, choices: Sequence[StreamedChoice],
                      body: Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any]]) -> web.Response:
    """Collect every choice, then answer ``body(choices, usage)``; an engine failure is raised for
    the error middleware to answer in the route's error shape."""
    async for index, out, request in outputs:
        tally.record(out, index, request)
        choices[index].record(out)
    if tally.failed:
        raise EngineFailure("internal error while generating")
    served.record_finished(tally)
    return json_response(body([c.json_choice() for c in choices], tally.usage()))


async def answer_stream(served: ServedModel, request: web.Request, outputs: Outputs, tally: ReplyTally,
                        writer: StreamWriter) -> web.StreamResponse:
    """SSE as ``writer`` writes it. The response opens with the first event after the opening
    (an error before that is raised for the error middleware to answer with a status)."""
    stream = EventStream(request, writer.opening(), served.keepalive_s, served.write_timeout_s)
    try:
        async with aclosing(stream.relay(outputs)) as events:
            async for index, out, request_number in events:
                tally.record(out, index, request_number)
                for event in writer.events(index, out):
                    await stream.send(event)
                if out.finish_reason == "error":
                    raise EngineFailure("internal error while generating")
        ending = writer.closing()
    except EngineFailure as exc:
        if not stream.opened:
            raise
        ending = writer.error(str(exc))
    else:
        served.record_finished(tally)
    for event in ending:
        await stream.send(event)
    return await stream.close()


class ChunkWriter:
    """The OpenAI stream of chat and legacy completions: a chunk per choice event, each
    choice's finish chunk, the usage once (on the last finish chunk, or with include_usage on
    one more chunk without choices), then ``data: [DONE]``."""

    def __init__(self, tally: ReplyTally, choices: Sequence[StreamedChoice], include_usage: bool,
                 chunk: Callable[[list[dict[str, Any]], dict[str, Any] | None], dict[str, Any]],
                 opening: Sequence[dict[str, Any]] = ()) -> None:
        self.tally = tally
        self.choices = choices
        self.include_usage = include_usage
        self.chunk = chunk
        self._opening = opening

    def opening(self) -> bytes:
        return b"".join(sse(self.chunk([body], None)) for body in self._opening)

    def events(self, index: int, out: RequestOutput) -> list[bytes]:
        choice = self.choices[index]
        events = []
        body = choice.stream(out)
        if body is not None:
            events.append(sse(self.chunk([body], None)))
        if out.finished and out.finish_reason != "error":
            last = self.tally.done and not self.include_usage
            events.append(sse(self.chunk([choice.finish_chunk()], self.tally.usage() if last else None)))
        return events

    def closing(self) -> list[bytes]:
        return ([sse(self.chunk([], self.tally.usage()))] if self.include_usage else []) + [DONE]

    def error(self, message: str) -> list[bytes]:
        return [sse(error_body(message, type_="server_error")), DONE]
