"""A Messages reply, built once from block events and written two ways: as the message object
(non-streamed) and as Anthropic's event stream (``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta`` / ``content_block_stop``, ``message_delta``
with the stop reason and usage, ``message_stop``; no ``[DONE]``). Both come from the same
parser and block assembler fed output by output, so a stream's joined events equal the message.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from ..chat.blocks import BlockAssembler, BlockDelta, BlockEvent, BlockStart
from ..chat.output_parser import ChatOutputParser
from ..engine.outputs import RequestOutput
from ..openai.serving import ReplyTally
from ..openai.streaming import sse
from .errors import error_body

BLOCK_TYPES = {"reasoning": "thinking", "text": "text", "tool_call": "tool_use"}
DELTA_TYPES = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
               "tool_call": ("input_json_delta", "partial_json")}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def thinking_signature(thinking: str) -> str:
    """Anthropic's clients require a signature on every thinking block and send it back; this
    one only says which server wrote the block (any signature is accepted on the way in)."""
    return "qwen-serve:" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


class MessageReply:
    """One reply's content blocks, grown from the engine's outputs."""

    def __init__(self, message_id: str, model: str, parser: ChatOutputParser) -> None:
        self.id = message_id
        self.model = model
        self._parser = parser
        self._assembler = BlockAssembler()
        self.content: list[dict[str, Any]] = []
        self._arguments: dict[int, str] = {}  # tool_use block index -> its input as JSON text
        self._engine_reason = "stop"
        self._stopped_by: str | int | None = None

    def take(self, out: RequestOutput) -> list[BlockEvent]:
        delta = self._parser.feed(out.new_text)
        if out.finished:
            delta = delta + self._parser.finish()
            self._engine_reason, self._stopped_by = out.finish_reason or "stop", out.stop_reason
        events = self._assembler.take(delta) + (self._assembler.finish() if out.finished else [])
        for event in events:
            self._apply(event)
        return events

    def _apply(self, event: BlockEvent) -> None:
        if isinstance(event, BlockStart):
            self.content.append(self.start_block(event))
        elif isinstance(event, BlockDelta):
            block = self.content[event.index]
            if event.kind == "tool_call":
                self._arguments[event.index] = self._arguments.get(event.index, "") + event.text
            else:
                block[DELTA_TYPES[event.kind][1]] += event.text
        else:
            block = self.content[event.index]
            if event.kind == "reasoning":
                block["signature"] = thinking_signature(block["thinking"])
            elif event.kind == "tool_call":
                block["input"] = json.loads(self._arguments.pop(event.index, "") or "{}")

    @staticmethod
    def start_block(event: BlockStart) -> dict[str, Any]:
        if event.kind == "tool_call":
            return {"type": "tool_use", "id": "toolu_" + event.call.id.removeprefix("call_"),
                    "name": event.call.name, "input": {}}
        if event.kind == "reasoning":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "text", "text": ""}

    @property
    def stop_reason(self) -> str:
        if self._engine_reason == "length":
            return "max_tokens"
        if any(block["type"] == "tool_use" for block in self.content):
            return "tool_use"
        return "stop_sequence" if isinstance(self._stopped_by, str) else "end_turn"

    @property
    def stop_sequence(self) -> str | None:
        return self._stopped_by if self.stop_reason == "stop_sequence" else None

    def message(self) -> dict[str, Any]:
        """The message object, but for its usage (the reply's tally has that)."""
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.content, "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}


def anthropic_usage(tally: ReplyTally) -> dict[str, int]:
    """Anthropic counts input as input + cache reads + cache writes: the prompt tokens the
    prefix cache served are cache reads, the rest input."""
    cached = tally.cached_tokens
    return {"input_tokens": tally.prompt_tokens - cached, "output_tokens": tally.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


class MessageStream:
    """The reply as answer_stream writes it (qwen_serve.openai.serving.StreamWriter)."""

    def __init__(self, reply: MessageReply, tally: ReplyTally) -> None:
        self.reply = reply
        self.tally = tally

    def opening(self) -> bytes:
        start = {"id": self.reply.id, "type": "message", "role": "assistant", "model": self.reply.model,
                 "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": self.tally.prompt_tokens, "output_tokens": 0,
                           "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
        return (sse({"type": "message_start", "message": start}, "message_start")
                + sse({"type": "ping"}, "ping"))

    def events(self, index: int, out: RequestOutput) -> list[bytes]:
        return [sse(body, body["type"]) for event in self.reply.take(out) for body in self._bodies(event)]

    def _bodies(self, event: BlockEvent) -> list[dict[str, Any]]:
        if isinstance(event, BlockStart):
            return [{"type": "content_block_start", "index": event.index,
                     "content_block": MessageReply.start_block(event)}]
        if isinstance(event, BlockDelta):
            kind, field = DELTA_TYPES[event.kind]
            return [{"type": "content_block_delta", "index": event.index, "delta": {"type": kind, field: event.text}}]
        bodies = []
        if event.kind == "reasoning":
            signature = self.reply.content[event.index]["signature"]
            bodies.append({"type": "content_block_delta", "index": event.index,
                           "delta": {"type": "signature_delta", "signature": signature}})
        return bodies + [{"type": "content_block_stop", "index": event.index}]

    def closing(self) -> list[bytes]:
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": self.reply.stop_reason, "stop_sequence": self.reply.stop_sequence},
                 "usage": anthropic_usage(self.tally)}
        return [sse(delta, "message_delta"), sse({"type": "message_stop"}, "message_stop")]

    def error(self, message: str) -> list[bytes]:
        return [sse(error_body(500, message), "error")]
