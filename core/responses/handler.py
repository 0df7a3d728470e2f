"""POST /v1/responses, GET and DELETE /v1/responses/{id}: translate, run as a chat turn,
answer in the Responses API's shapes; keep the response when asked (``store``, the default) so
GET returns it and ``previous_response_id`` continues its conversation. Any model name is
accepted and echoed back: agent clients send whatever name their user configured, and this
server serves one model."""
from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any

from aiohttp import web

from ..chat.validation import validate
from ..openai.bodies import error_body, json_response
from ..openai.serving import OneChoice, ReplyTally, ServedModel, answer_json, answer_stream
from ..openai.turn import start_turn
from .protocol import ENCRYPTED_REASONING, INPUT_ITEMS, parse_responses_request
from .reply import ResponseReply, new_id, request_echo
from .store import ResponseStore
from .stream import ResponseStream
from .translate import chat_turn


def not_found(response_id: str, param: str | None = None) -> web.Response:
    """OpenAI's 404 for a response it does not have (vLLM's too)."""
    message = (f"no stored response {response_id!r} (responses are kept in memory, the least recently used "
               "dropped first: --responses-store-mb)")
    code = "previous_response_not_found" if param == "previous_response_id" else None
    return json_response(error_body(message, param=param, code=code), status=404)


class Responses:
    def __init__(self, served: ServedModel, store: ResponseStore) -> None:
        self.served = served
        self.store = store

    async def create(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        served = self.served
        req = parse_responses_request(await request.read())
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = self.store.get(req.previous_response_id)
            if stored is None:
                return not_found(req.previous_response_id, "previous_response_id")
            history = stored.items
        items = validate(INPUT_ITEMS, history, "previous_response_id") + req.items
        turn = start_turn(served, chat_turn(req, items, served.sampling_defaults), new_id("resp"), arrival)
        tally = ReplyTally(turn.reply_id, 1, len(turn.rendered.token_ids), arrival)
        reply = ResponseReply(tally, request_echo(req, served.name, turn.params), turn.new_parser(),
                              turn.chat_format.think_end_token_id, ENCRYPTED_REASONING in req.include)

        def keep(response: dict[str, Any]) -> dict[str, Any]:
            if req.store:
                inputs = INPUT_ITEMS.dump_python(req.items, mode="json", by_alias=True, exclude_none=True)
                self.store.put(response, history + inputs + response["output"])
            return response

        async with aclosing(turn.outputs) as outputs:
            keyed = ((0, out, 0) async for out in outputs)
            if req.stream:
                return await answer_stream(served, request, keyed, tally, ResponseStream(reply, keep))
            return await answer_json(served, keyed, tally, [OneChoice(reply.take, reply.response)], lambda bodies, _: keep(bodies[0]))

    async def retrieve(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        stored = self.store.get(response_id)
        return not_found(response_id) if stored is None else json_response(stored.response)

    async def delete(self, request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if not self.store.delete(response_id):
            return not_found(response_id)
        return json_response({"id": response_id, "object": "response", "deleted": True})
