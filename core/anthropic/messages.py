"""POST /v1/messages and /v1/messages/count_tokens: translate, run as a chat turn, answer in
Anthropic's shapes. Any model name is accepted and echoed back: agent clients send whatever
name their user configured, and this server serves one model."""
from __future__ import annotations

import time
from contextlib import aclosing

from aiohttp import web

from ..openai.bodies import json_response
from ..openai.serving import OneChoice, ReplyTally, ServedModel, answer_json, answer_stream
from ..openai.turn import start_turn
from .protocol import parse_count_tokens_request, parse_messages_request
from .reply import MessageReply, MessageStream, anthropic_usage, new_message_id
from .translate import chat_turn


class Messages:
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def create(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        served = self.served
        req = parse_messages_request(await request.read())
        turn = start_turn(served, chat_turn(req, served.sampling_defaults), new_message_id(), arrival)
        tally = ReplyTally(turn.reply_id, 1, len(turn.rendered.token_ids), arrival)
        reply = MessageReply(turn.reply_id, req.model, turn.new_parser())
        async with aclosing(turn.outputs) as outputs:
            keyed = ((0, out, 0) async for out in outputs)
            if req.stream:
                return await answer_stream(served, request, keyed, tally, MessageStream(reply, tally))
            return await answer_json(served, keyed, tally, [OneChoice(reply.take, reply.message)],
                                     lambda bodies, _: {**bodies[0], "usage": anthropic_usage(tally)})

    async def count_tokens(self, request: web.Request) -> web.Response:
        req = parse_count_tokens_request(await request.read())
        turn = chat_turn(req)
        rendered = self.served.chat_format.render(turn.messages, turn.tools, turn.tool_choice, turn.template_kwargs)
        return json_response({"input_tokens": len(rendered.token_ids)})
