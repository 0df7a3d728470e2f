"""A Responses reply as Server-Sent Events: every event named by an ``event:`` line and numbered
by ``sequence_number`` from 0, no ``[DONE]``. ``response.created`` and ``response.in_progress``
open it; each output item is ``output_item.added``, its content part's ``content_part.added``,
its deltas (``reasoning_text.delta``, ``output_text.delta`` or one
``function_call_arguments.delta``), their ``.done``, ``content_part.done`` and
``output_item.done`` with the whole item; ``response.completed`` (``response.incomplete`` when
a length limit cut it) ends it with the whole response, ``response.failed`` when the engine
failed after the stream opened. The openai SDK's accumulator checks this order.
"""
from __future__ import annotations

from typing import Any, Callable

from ..chat.blocks import BlockDelta, BlockEvent, BlockStart
from ..engine.outputs import RequestOutput
from ..openai.streaming import sse
from .reply import ResponseReply

DELTA_EVENTS = {"reasoning": "response.reasoning_text", "text": "response.output_text",
                "tool_call": "response.function_call_arguments"}


class ResponseStream:
    """The reply as answer_stream writes it (qwen_serve.openai.serving.StreamWriter); ``keep``
    gets the final response before the client sees it end (so the next turn finds it stored)."""

    def __init__(self, reply: ResponseReply, keep: Callable[[dict[str, Any]], Any]) -> None:
        self.reply = reply
        self.keep = keep
        self._sequence_number = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._sequence_number, **fields}
        self._sequence_number += 1
        return sse(body, kind)

    def opening(self) -> bytes:
        started = self.reply.response("in_progress")
        return self._event("response.created", response=started) + self._event("response.in_progress",
                                                                                response=started)

    def events(self, index: int, out: RequestOutput) -> list[bytes]:
        return [event for block in self.reply.take(out) for event in self._block_events(block)]

    def _block_events(self, block: BlockEvent) -> list[bytes]:
        reply, index = self.reply, block.index
        where = {"item_id": reply.output[index]["id"], "output_index": index}
        text_part = {} if block.kind == "tool_call" else {"content_index": 0}
        logprobs = {"logprobs": []} if block.kind == "text" else {}
        if isinstance(block, BlockStart):
            events = [self._event("response.output_item.added", output_index=index, item=reply.opened(index))]
            if text_part:
                events.append(self._event("response.content_part.added", **where, **text_part,
                                          part=reply.empty_part(index)))
            return events
        if isinstance(block, BlockDelta):
            return [self._event(DELTA_EVENTS[block.kind] + ".delta", **where, **text_part, delta=block.text,
                                **logprobs)]
        item = reply.output[index]
        if block.kind == "tool_call":
            events = [self._event(DELTA_EVENTS["tool_call"] + ".done", **where, name=item["name"],
                                  arguments=item["arguments"])]
        else:
            part = item["content"][0]
            events = [self._event(DELTA_EVENTS[block.kind] + ".done", **where, **text_part, text=part["text"],
                                  **logprobs),
                      self._event("response.content_part.done", **where, **text_part, part=part)]
        return events + [self._event("response.output_item.done", output_index=index, item=item)]

    def closing(self) -> list[bytes]:
        response = self.keep(self.reply.response())
        return [self._event(f"response.{response['status']}", response=response)]

    def error(self, message: str) -> list[bytes]:
        failed = self.reply.response("failed", error={"code": "server_error", "message": message})
        return [self._event("response.failed", response=failed)]
