"""A model's chat format: how its template renders a conversation (with tools and template
arguments) and which parsers read its replies. The server and the offline ``LLM.chat`` both go
through one ChatFormat, so a prompt renders and a reply parses the same way in both.

What the template can do is found out once, by rendering: whether it renders ``tools`` (a
probe tool's name must appear in the prompt; if not, the Hermes fallback of
tool_parsers.hermes_prompt describes the tools instead), and, for every request, where the
new turn starts relative to a think block (read from the text the generation prompt adds).
Unless named, the parsers are chosen from the template's source: one that writes ``<think>``
gets Qwen3's reasoning parser, one that writes ``<function=`` Qwen3-Coder's XML tool calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..checkpoints.tokenizer import Tokenizer
from ..errors import InvalidRequest
from ..sampling.params import ToolCallFormat
from .output_parser import ChatOutputParser
from .reasoning import ThinkState, choose_reasoning_parser
from .tool_parsers import choose_tool_parser
from .tool_parsers.base import FirstCallOnly
from .tool_parsers.hermes_prompt import inline_tool_history, with_tools_described
from .tools import Tool, ToolChoice

PROBE_TOOL_NAME = "qwen_serve_probe_tool"
RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt")


@dataclass(frozen=True)
class RenderedChat:
    text: str
    token_ids: list[int]
    think_state: ThinkState
    parsed_tools: tuple[Tool, ...]  # the tools the reply is parsed for (none with tool_choice "none")


class ChatFormat:
    def __init__(self, tokenizer: Tokenizer, reasoning_parser: str | None = None,
                 tool_call_parser: str | None = None) -> None:
        self.tokenizer = tokenizer
        source = tokenizer.chat_template.source if tokenizer.chat_template else None
        self.reasoning_parser = choose_reasoning_parser(reasoning_parser, source)
        self.tool_parser = choose_tool_parser(tool_call_parser, source)
        self.renders_tools = self._renders_tools()
        end_tag = self.reasoning_parser.end_tag
        self.think_end_token_id = tokenizer.token_to_id(end_tag) if end_tag else None

    def _renders_tools(self) -> bool:
        probe = {"type": "function", "function": {"name": PROBE_TOOL_NAME, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}
        try:
            prompt = self.tokenizer.render_chat([{"role": "user", "content": "hi"}], True, tools=[probe])
        except Exception:  # no template, or one that cannot take tools
            return False
        return PROBE_TOOL_NAME in prompt

    def render(self, messages: list[dict[str, Any]], tools: Sequence[Tool] = (), tool_choice: ToolChoice = ToolChoice(),
               template_kwargs: Mapping[str, Any] | None = None, add_generation_prompt: bool = True) -> RenderedChat:
        """Messages as qwen_serve.chat.messages shapes them; template errors are a 400."""
        context = dict(template_kwargs or {})
        reserved = [k for k in RESERVED_TEMPLATE_KWARGS if k in context]
        if reserved:
            raise InvalidRequest(f"'chat_template_kwargs' may not set {', '.join(reserved)} (use the request fields)",
                                 param="chat_template_kwargs")
        offered = tool_choice.offered(tuple(tools))
        specs = [t.spec for t in offered]
        if not self.renders_tools:
            messages = inline_tool_history(messages)
            if specs:
                messages = with_tools_described(messages, specs)
        elif specs:
            context["tools"] = specs
        try:
            text = self.tokenizer.render_chat(messages, add_generation_prompt, **context)
            state = self._think_state(messages, text, context) if add_generation_prompt else ThinkState.NONE
        except Exception as exc:  # the template rejected the conversation (e.g. role order)
            raise InvalidRequest(f"could not apply the chat template: {exc}", param="messages") from None
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)  # the template wrote BOS and markers
        return RenderedChat(text, token_ids, state, offered if self.tool_parser is not None else ())

    def _think_state(self, messages: list[dict[str, Any]], text: str, context: dict[str, Any]) -> ThinkState:
        if self.reasoning_parser.end_tag is None:
            return ThinkState.NONE
        try:
            history = self.tokenizer.render_chat(messages, False, **context)
        except Exception:  # a template that insists on a generation prompt: read the whole prompt
            history = ""
        generation_prompt = text[len(history):] if text.startswith(history) else text
        return self.reasoning_parser.prompt_state(generation_prompt)

    def output_parser(self, rendered: RenderedChat, parallel_tool_calls: bool = True) -> ChatOutputParser:
        """A fresh parser for one choice of a request rendered by this format; without
        ``parallel_tool_calls`` it gives out the first call only."""
        tools = self.tool_parser(rendered.parsed_tools) if rendered.parsed_tools else None
        if tools is not None and not parallel_tool_calls:
            tools = FirstCallOnly(tools)
        return ChatOutputParser(self.reasoning_parser(rendered.think_state), tools)

    @property
    def tool_format(self) -> ToolCallFormat:
        """The form a forced tool call is written in: the one this format's tool parser reads."""
        return self.tool_parser.call_format if self.tool_parser is not None else "hermes"

    def constraint_start(self, rendered: RenderedChat) -> int | None:
        """The token after which a grammar applies: the think block's end when the prompt left it open."""
        return self.think_end_token_id if rendered.think_state is ThinkState.OPEN else None


def check_parser_names(reasoning_parser: str | None, tool_call_parser: str | None) -> None:
    """A one-line error for a parser name that is not registered (before any model loads)."""
    if reasoning_parser is not None:
        choose_reasoning_parser(reasoning_parser, None)
    choose_tool_parser(tool_call_parser)
