"""The request schema of every endpoint: parse and validate a body into one frozen request.

The pieces live beside this file (messages, tools, structured output, sampling fields, typed
field readers); here each endpoint's body is put together from them. Every rejection is an
InvalidRequest naming the field (HTTP 400).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..chat.fields import boolean, integer, mapping, parse_json_object, string, token_ids
from ..chat.messages import parse_messages
from ..chat.tools import Tool, ToolChoice, parse_tool_choice, parse_tools
from ..errors import InvalidRequest
from ..sampling.params import SamplingParams
from .sampling_fields import parse_sampling
from .structured import ResponseFormat, parse_response_format

DEFAULT_MAX_TOKENS = 256  # chat completions without max_tokens
DEFAULT_COMPLETION_MAX_TOKENS = 16  # legacy completions, as OpenAI
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    params: SamplingParams  # without ``structured``: that needs the rendered prompt
    stream: bool
    model: str | None
    include_usage: bool = False
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_format: ResponseFormat | None = None
    priority: int = 0  # lower is served first under --scheduling-policy priority (vLLM's meaning)
    max_tokens_given: bool = True  # False: params.max_tokens is the default (ServedModel.fit_default_max_tokens)

    @property
    def top_logprobs(self) -> int | None:
        """How many alternatives per token; None when no logprobs were asked for."""
        return self.params.logprobs


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[str | list[int]]
    params: SamplingParams
    stream: bool
    model: str | None
    include_usage: bool = False
    priority: int = 0
    max_tokens_given: bool = True


@dataclass(frozen=True)
class TokenizeRequest:
    prompt: str | None  # either a prompt ...
    messages: list[dict[str, Any]] | None  # ... or a conversation for the chat template
    model: str | None
    add_special_tokens: bool
    add_generation_prompt: bool = True
    tools: tuple[Tool, ...] = ()
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    return_token_strs: bool = False


@dataclass(frozen=True)
class DetokenizeRequest:
    tokens: list[int]
    model: str | None


def parse_chat_request(raw: bytes, vocab_size: int) -> ChatRequest:
    body = parse_json_object(raw)
    messages = parse_messages(body.get("messages"))
    max_tokens = integer(body, "max_tokens", DEFAULT_MAX_TOKENS, 1)  # checked even when overridden
    max_tokens = integer(body, "max_completion_tokens", max_tokens, 1)
    logprobs = boolean(body, "logprobs", False)
    top_logprobs = integer(body, "top_logprobs", None, 0, 20)
    if top_logprobs is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    params = parse_sampling(body, vocab_size=vocab_size, max_tokens=max_tokens,
                            logprobs=(top_logprobs or 0) if logprobs else None)
    tools = parse_tools(body.get("tools"))
    stream = boolean(body, "stream", False)
    return ChatRequest(
        messages, params, stream, _model(body), _include_usage(body, stream), tools,
        parse_tool_choice(body.get("tool_choice"), tools), template_kwargs(body),
        parse_response_format(body.get("response_format")), _priority(body),
        _given(body, "max_tokens", "max_completion_tokens"))


def parse_completion_request(raw: bytes, vocab_size: int) -> CompletionRequest:
    body = parse_json_object(raw)
    prompts = _prompts(body.get("prompt"), vocab_size)
    for name, refusal in (("echo", "is not supported"), ("suffix", "is not supported")):
        if body.get(name) not in (None, False, ""):
            raise InvalidRequest(f"'{name}' {refusal}", param=name)
    logprobs = integer(body, "logprobs", None, 0, 20)
    params = parse_sampling(body, vocab_size=vocab_size, logprobs=logprobs,
                            max_tokens=integer(body, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, 1))
    best_of = integer(body, "best_of", None, 1)
    if best_of is not None and best_of != params.n:
        raise InvalidRequest("'best_of' other than n is not supported", param="best_of")
    stream = boolean(body, "stream", False)
    return CompletionRequest(prompts, params, stream, _model(body), _include_usage(body, stream), _priority(body),
                             _given(body, "max_tokens"))


def parse_tokenize_request(raw: bytes) -> TokenizeRequest:
    body = parse_json_object(raw)
    model = _model(body)
    with_prompt = body.get("prompt") is not None
    if with_prompt == (body.get("messages") is not None):
        raise InvalidRequest("give either 'prompt' or 'messages'", param="prompt")
    # The chat-only fields are checked with a prompt too (and then unused), as the schema documents them.
    prompt = string(body, "prompt")
    messages = None if with_prompt else parse_messages(body["messages"])
    return TokenizeRequest(prompt, messages, model, boolean(body, "add_special_tokens", with_prompt),
                           boolean(body, "add_generation_prompt", True), parse_tools(body.get("tools")),
                           template_kwargs(body), boolean(body, "return_token_strs", False))


def parse_detokenize_request(raw: bytes, vocab_size: int) -> DetokenizeRequest:
    body = parse_json_object(raw)
    return DetokenizeRequest(token_ids(body.get("tokens"), "tokens", vocab_size, allow_empty=True), _model(body))


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """``chat_template_kwargs``, with ``reasoning_effort: "none"`` meaning enable_thinking false
    (an explicit enable_thinking in chat_template_kwargs wins)."""
    kwargs = dict(mapping(body, "chat_template_kwargs") or {})
    effort = string(body, "reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise InvalidRequest(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}",
                             param="reasoning_effort")
    if effort == "none":
        kwargs.setdefault("enable_thinking", False)
    return kwargs


def _priority(body: dict[str, Any]) -> int:
    return integer(body, "priority", 0, -(2**63), 2**63 - 1)


def _given(body: dict[str, Any], *names: str) -> bool:
    return any(body.get(name) is not None for name in names)


def _model(body: dict[str, Any]) -> str | None:
    return string(body, "model")


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = mapping(body, "stream_options")
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    return boolean(options, "include_usage", False, "stream_options")


def _prompts(prompt: Any, vocab_size: int) -> list[str | list[int]]:
    """A string, an array of strings, an array of token ids, or an array of those arrays."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) for p in prompt):
            return [token_ids(p, f"prompt[{i}]", vocab_size) for i, p in enumerate(prompt)]
        if not any(isinstance(p, (str, list)) for p in prompt):
            return [token_ids(prompt, "prompt", vocab_size)]
    raise InvalidRequest("'prompt' must be a string, an array of strings, an array of token ids or an array "
                         "of token-id arrays", param="prompt")
