"""A Responses reply: its output items built once from block events (a reasoning block is a
``reasoning`` item, text a ``message`` with one ``output_text`` part, each tool call a
``function_call``), and the response object around them. The JSON answer and the event stream
(stream.py) both read this one reply, fed output by output, so a stream's final response
equals the non-streamed one.
"""
from __future__ import annotations

import uuid
from typing import Any

from ..chat.blocks import BlockAssembler, BlockDelta, BlockEvent, BlockStart
from ..chat.output_parser import ChatOutputParser
from ..engine.outputs import RequestOutput
from ..openai.serving import ReplyTally
from ..sampling.params import SamplingParams
from .encrypted import seal
from .protocol import FunctionToolSpec, ResponsesRequest

ITEM_PREFIXES = {"reasoning": "rs", "text": "msg"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def request_echo(req: ResponsesRequest, model: str, params: SamplingParams) -> dict[str, Any]:
    """The request's settings, as the response object repeats them (the sampling as it ran)."""
    choice = req.tool_choice
    return {"model": req.model or model, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort, "summary": None}, "store": req.store,
            "temperature": params.temperature, "top_p": params.top_p,
            "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)},
            "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools if isinstance(t, FunctionToolSpec)],
            "truncation": "disabled", "metadata": req.metadata}


class ResponseReply:
    """One reply's output items, grown from the engine's outputs, and its response object.

    Reasoning tokens are counted exactly where the think block's end is one token (Qwen3's
    ``</think>``): the reply's tokens up to and including it; a reply cut inside its think
    block is all reasoning."""

    def __init__(self, tally: ReplyTally, echo: dict[str, Any], parser: ChatOutputParser,
                 think_end_token_id: int | None, seal_reasoning: bool) -> None:
        self.tally = tally
        self.echo = echo
        self._parser = parser
        self._assembler = BlockAssembler()
        self._think_end = think_end_token_id
        self._seal = seal_reasoning
        self.output: list[dict[str, Any]] = []
        self.finish_reason: str | None = None  # the engine's, once the reply has finished
        self._tokens = 0
        self._reasoning_tokens: int | None = None  # known once the think block's end is seen

    @property
    def id(self) -> str:
        return self.tally.id

    def take(self, out: RequestOutput) -> list[BlockEvent]:
        self._count_reasoning(out.new_token_ids)
        events = self._assembler.take(self._parser.feed(out.new_text))
        if out.finished:
            events += self._assembler.take(self._parser.finish())
        for event in events:
            self._apply(event, "completed")
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
            last = self._assembler.finish()  # the block the reply ended in: cut short by a length limit?
            for event in last:
                self._apply(event, "incomplete" if self.finish_reason == "length" else "completed")
            events += last
        return events

    def _count_reasoning(self, token_ids: list[int]) -> None:
        if self._reasoning_tokens is None and self._think_end in token_ids:
            self._reasoning_tokens = self._tokens + token_ids.index(self._think_end) + 1
        self._tokens += len(token_ids)

    @property
    def reasoning_tokens(self) -> int:
        if self._reasoning_tokens is not None:
            return self._reasoning_tokens
        only_reasoning = self.output and all(item["type"] == "reasoning" for item in self.output)
        return self._tokens if only_reasoning else 0

    def _apply(self, event: BlockEvent, status: str) -> None:
        if isinstance(event, BlockStart):
            self.output.append(self._start_item(event))
            return
        item = self.output[event.index]
        if isinstance(event, BlockDelta):
            if event.kind == "tool_call":
                item["arguments"] += event.text
            else:
                item["content"][0]["text"] += event.text
            return
        item["status"] = status
        if event.kind == "reasoning" and self._seal:
            item["encrypted_content"] = seal(item["content"][0]["text"])

    @staticmethod
    def _start_item(event: BlockStart) -> dict[str, Any]:
        if event.kind == "tool_call":
            return {"id": "fc_" + event.call.id.removeprefix("call_"), "type": "function_call", "status": "in_progress",
                    "call_id": event.call.id, "name": event.call.name, "arguments": ""}
        item_id = new_id(ITEM_PREFIXES[event.kind])
        if event.kind == "reasoning":
            return {"id": item_id, "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
        return {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}

    def opened(self, index: int) -> dict[str, Any]:
        """Item ``index`` as it was when it started: no content yet (its part is added next)."""
        item = {**self.output[index], "status": "in_progress"}
        item.pop("encrypted_content", None)
        if "arguments" in item:
            return {**item, "arguments": ""}
        return {**item, "content": []}

    def empty_part(self, index: int) -> dict[str, Any]:
        """The content part of item ``index`` before any text."""
        return {**self.output[index]["content"][0], "text": ""}

    @property
    def status(self) -> str:
        if self.finish_reason is None:
            return "in_progress"
        return "incomplete" if self.finish_reason == "length" else "completed"

    def response(self, status: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object: as it starts (in_progress: no output yet), as it ended, or failed."""
        status = status or self.status
        started = status == "in_progress"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.tally.created, "status": status,
                "error": error, "incomplete_details": incomplete, **self.echo,
                "output": [] if started else self.output, "usage": None if started else self.usage()}

    def usage(self) -> dict[str, Any]:
        tally = self.tally
        return {"input_tokens": tally.prompt_tokens,
                "input_tokens_details": {"cached_tokens": tally.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": tally.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": tally.prompt_tokens + tally.completion_tokens}


