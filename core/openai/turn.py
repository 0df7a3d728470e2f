"""A chat turn as every chat-shaped API asks for one (Chat Completions, Anthropic's Messages):
the conversation in the shape chat templates take, the tools, the constraints and the sampling.
Each API translates its request into a ChatTurn; ``start_turn`` renders it, fits max_tokens,
adds the grammar a forced tool choice or a response format needs, and queues it, so the APIs
share one path from request to engine and differ only in how they read and write."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Mapping

from ..chat.format import ChatFormat, RenderedChat
from ..chat.output_parser import ChatOutputParser
from ..chat.tools import Tool, ToolChoice
from ..engine.outputs import RequestOutput
from ..sampling.params import SamplingParams
from .serving import ServedModel
from .structured import ResponseFormat, structured_output


@dataclass(frozen=True)
class ChatTurn:
    messages: list[dict[str, Any]]  # as qwen_serve.chat.messages shapes them
    params: SamplingParams  # without ``structured``: that needs the rendered prompt
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    response_format: ResponseFormat | None = None
    max_tokens_given: bool = False  # True: a max_tokens the prompt leaves no room for is a 400; False: cut to fit
    priority: int = 0
    thinking_budget: int | None = None  # tokens a think block may take (None: the server's --reasoning-budget)
    parallel_tool_calls: bool = True  # False: at most one call (a forced call's grammar allows one)


@dataclass(frozen=True)
class StartedTurn:
    reply_id: str  # the engine request's id
    rendered: RenderedChat
    params: SamplingParams  # as the engine runs them
    outputs: AsyncIterator[RequestOutput]  # close it (aclosing) to abort the request
    chat_format: ChatFormat
    parallel_tool_calls: bool = True

    def new_parser(self) -> ChatOutputParser:
        """A fresh parser of one choice's output (reasoning, content, tool calls)."""
        return self.chat_format.output_parser(self.rendered, self.parallel_tool_calls)


def start_turn(served: ServedModel, turn: ChatTurn, reply_id: str, arrival: float) -> StartedTurn:
    """Render, constrain and queue ``turn``; every mistake in it is an InvalidRequest before
    anything is queued."""
    chat_format = served.chat_format
    rendered = chat_format.render(turn.messages, turn.tools, turn.tool_choice, turn.template_kwargs)
    params = served.fit_default_max_tokens(turn.params, len(rendered.token_ids), turn.max_tokens_given)
    budget = served.reasoning_budget if turn.thinking_budget is None else turn.thinking_budget
    if budget is not None and chat_format.think_end_token_id is not None:
        params = replace(params, thinking_budget=budget)
    structured = structured_output(turn.response_format, turn.tool_choice, turn.tools,
                                   chat_format.constraint_start(rendered), tool_format=chat_format.tool_format,
                                   single_call=not turn.parallel_tool_calls)
    if structured is not None:
        params = replace(params, structured=structured)
    outputs = served.engine.generate(reply_id, rendered.token_ids, params, arrival, priority=turn.priority)
    served.metrics.record_request()
    return StartedTurn(reply_id, rendered, params, outputs, chat_format, turn.parallel_tool_calls)
