"""The request schema of every route, declared once as pydantic models: their validation is the
server's, and GET /openapi.json is generated from them (qwen_serve.server.openapi).

Messages and tools are declared in qwen_serve.chat (the offline LLM validates them too),
response_format in .structured; the rules between fields are the models' own validators.
Every rejection is an InvalidRequest naming the field (HTTP 400).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from ..chat.messages import Messages
from ..chat.reasoning.effort import effort_budget, effort_template_kwargs
from ..chat.tools import ToolChoice, ToolChoiceField, Tools
from ..chat.validation import Body, Integer, integer, parse_json_object, validate
from ..errors import InvalidRequest
from ..sampling.defaults import SamplingDefaults
from ..sampling.params import SamplingParams
from .structured import (
    ResponseFormat,
    ResponseFormatField,
    StructuredOutputs,
    gbnf_constraint,
    one_constraint,
    structured_output,
)
from .turn import ChatTurn

MAX_N = 128  # OpenAI's limit; whether n choices fit the KV pool is the engine's check
MAX_STOPS = 16
DEFAULT_FITS = "omitted: the default, or fewer when the prompt leaves less room under the maximum sequence length"
SAMPLING_PARAMS_FIELDS = frozenset(f.name for f in fields(SamplingParams))
TOKEN_ID = {"$ref": "#/components/schemas/TokenId"}  # bounded by this server's vocabulary (see openapi.py)

INT64 = {"ge": -(2**63), "le": 2**63 - 1}
StopString = Annotated[str, Field(min_length=1)]


def _in_vocabulary(ids: list[int], info: ValidationInfo) -> list[int]:
    vocab_size = info.context["vocab_size"]
    wrong = next((t for t in ids if not 0 <= t < vocab_size), None)
    if wrong is not None:
        raise InvalidRequest(f"token ids must be in [0, {vocab_size}), got {wrong}")
    return ids


TokenId = Annotated[Integer, WithJsonSchema(TOKEN_ID)]
TokenIds = Annotated[list[TokenId], AfterValidator(_in_vocabulary)]
SomeTokenIds = Annotated[list[TokenId], Field(min_length=1), AfterValidator(_in_vocabulary)]


def _a_bool(value: Any) -> Any:
    """A Literal[False] field in strict mode still takes 0 and 0.0 (they equal False): not here."""
    if not isinstance(value, bool):
        raise InvalidRequest("must be a boolean")
    return value


def _bias_by_token(bias: dict[str, float], info: ValidationInfo) -> dict[int, float]:
    by_token = {int(key): amount for key, amount in bias.items()}
    _in_vocabulary(list(by_token), info)
    return by_token


LogitBias = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Annotated[float, Field(ge=-100, le=100)]],
                      AfterValidator(_bias_by_token),
                      Field(description="token id (as a string) to a bias added to its logit",
                            json_schema_extra={"additionalProperties": False})]


class Request(Body):
    model: str | None = Field(None, description="optional; a name this server does not serve is a 404")


class StreamOptions(Body):
    include_usage: bool = False


class SamplingFields(Request):
    """What chat and legacy completions share: OpenAI's fields and ranges, and vLLM's for the
    ones OpenAI does not have (top_k, min_p, repetition_penalty, stop_token_ids, min_tokens,
    ignore_eos, vllm_xargs). A field named as one of SamplingParams' reaches it as it is."""

    temperature: float = Field(0.0, ge=0, le=2, description="0: greedy. Omitted (as top_p, top_k, min_p and "
                               "repetition_penalty): the model's generation_config.json value if it has one")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: integer(ge=0) = Field(0, description="0: off")
    min_p: float = Field(0.0, ge=0, le=1)
    seed: integer(**INT64) | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] = ()
    stop_token_ids: TokenIds = ()
    min_tokens: integer(ge=0) = Field(0, description="at most max_tokens")
    ignore_eos: bool = False
    n: integer(ge=1, le=MAX_N) = 1
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    logit_bias: LogitBias = {}
    vllm_xargs: dict[str, Any] = Field({}, description="arguments for plugins (vLLM's name): each name must be "
                                       "taken by a logits processor this server loaded, which checks its value")
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    priority: integer(**INT64) = Field(0, description="lower is served first (--scheduling-policy priority); "
                                           "other than 0 is a 400 under fcfs")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM's: the reply follows a JSON "
                                                         "schema, a regex, a choice of strings or a Lark grammar")
    grammar: str | None = Field(None, description="llama.cpp's: a GBNF grammar the reply belongs to (translated "
                                "to Lark; a construct the translator lacks is a 400 naming it)")
    _params: SamplingParams = PrivateAttr()
    _constraint: ResponseFormat | None = PrivateAttr(None)

    @property
    def params(self) -> SamplingParams:
        """Every sampling field but ``structured`` (that needs the rendered prompt: .structured)."""
        return self._params

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def max_tokens_given(self) -> bool:
        """False: params.max_tokens is the default (ServedModel.fit_default_max_tokens may lower it)."""
        return bool({"max_tokens", "max_completion_tokens"} & self.model_fields_set)

    def _set_params(self, max_tokens: int, logprobs: int | None, info: ValidationInfo) -> None:
        """SamplingParams from the fields of the same names, and the ones named otherwise; a
        sampling field the request leaves out takes the model's default (validation context
        ``sampling_defaults``), if it has one."""
        if self.min_tokens > max_tokens:
            raise InvalidRequest(f"must not exceed max_tokens ({max_tokens})", param="min_tokens")
        same = {name: getattr(self, name) for name in SAMPLING_PARAMS_FIELDS & type(self).model_fields.keys()}
        defaults = (info.context or {}).get("sampling_defaults", SamplingDefaults())
        same |= defaults.for_missing(self.model_fields_set)
        # SamplingParams' own ValueError is a 400 too
        self._params = SamplingParams(**{**same, "max_tokens": max_tokens, "logprobs": logprobs,
                                          "extra_args": self.vllm_xargs})

    @property
    def constraint(self) -> ResponseFormat | None:
        """What the reply's text must follow (response_format, structured_outputs or grammar)."""
        return self._constraint

    def _set_constraint(self, response_format: ResponseFormat | None = None) -> None:
        self._constraint = one_constraint(
            response_format=response_format,
            structured_outputs=None if self.structured_outputs is None else self.structured_outputs.constraint(),
            grammar=None if self.grammar is None else gbnf_constraint(self.grammar))

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("is only allowed with 'stream': true", param="stream_options")
        return self


class TemplateFields(Body):
    """What the chat template is rendered with, besides the messages."""

    tools: Tools = ()
    chat_template_kwargs: dict[str, Any] = Field({}, description='e.g. {"enable_thinking": false}')
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="none, minimal: enable_thinking false (unless chat_template_kwargs says otherwise); "
                          "low, medium: a think block of at most 1024, 8192 tokens; high: --reasoning-budget")

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {**effort_template_kwargs(self.reasoning_effort), **self.chat_template_kwargs}


class ChatCompletionRequest(SamplingFields, TemplateFields):
    messages: Messages
    max_tokens: integer(ge=1) = Field(256, description=DEFAULT_FITS)
    max_completion_tokens: integer(ge=1) | None = Field(None, description="takes precedence over max_tokens")
    logprobs: bool = False
    top_logprobs: integer(ge=0, le=20) | None = Field(None, description="needs logprobs: true")
    tool_choice: ToolChoiceField = Field("auto", validate_default=True)
    parallel_tool_calls: bool = Field(True, description="false: at most one tool call per reply")
    response_format: ResponseFormatField | None = None

    @property
    def turn(self) -> ChatTurn:
        return ChatTurn(self.messages, self.params, self.tools, self.tool_choice, self.template_kwargs,
                        self.constraint, self.max_tokens_given, self.priority,
                        effort_budget(self.reasoning_effort), self.parallel_tool_calls)

    @model_validator(mode="after")
    def _between_fields(self, info: ValidationInfo) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("requires 'logprobs': true", param="top_logprobs")
        self.tool_choice.check(self.tools)
        self._set_constraint(self.response_format)
        self._set_params(self.max_completion_tokens or self.max_tokens,
                         (self.top_logprobs or 0) if self.logprobs else None, info)
        return self


def _prompt_form(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    if all(isinstance(p, list) for p in value) and value:
        return "token_lists"
    return "texts" if any(isinstance(p, (str, list)) for p in value) or not value else "tokens"


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    return [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt


Prompt = Annotated[
    Union[Annotated[StopString, Tag("text")], Annotated[list[StopString], Field(min_length=1), Tag("texts")],
          Annotated[SomeTokenIds, Tag("tokens")], Annotated[list[SomeTokenIds], Field(min_length=1), Tag("token_lists")]],
    Discriminator(_prompt_form, custom_error_type="prompt_type", custom_error_message=(
        "must be a string, an array of strings, an array of token ids or an array of token-id arrays")),
    AfterValidator(_prompts), Field(description="each prompt is one engine request (an empty one is a 400)")]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: integer(ge=1) = Field(16, description=DEFAULT_FITS)
    logprobs: integer(ge=0, le=20) | None = None
    best_of: integer(ge=1) | None = Field(None, description="only equal to n")
    echo: Annotated[Literal[False], BeforeValidator(_a_bool)] = Field(False, description="not supported")
    suffix: Literal[""] = Field("", description="not supported")

    @model_validator(mode="after")
    def _between_fields(self, info: ValidationInfo) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequest("other than n is not supported", param="best_of")
        self._set_params(self.max_tokens, self.logprobs, info)
        self._set_constraint()
        structured = structured_output(self.constraint, ToolChoice(), (), after_token_id=None)
        if structured is not None:
            self._params = replace(self._params, structured=structured)
        return self


class TokenizeRequest(Request, TemplateFields, json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]}):
    """Either a prompt or messages (rendered by the chat template as a chat request would be;
    the chat-only fields are checked with a prompt too, and then unused)."""

    prompt: str | None = None
    messages: Messages | None = None
    add_special_tokens: bool | None = Field(None, description="omitted: true with a prompt, false with messages "
                                                              "(the template writes them)")
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give either 'prompt' or 'messages'", param="prompt")
        if self.add_special_tokens is None:
            self.add_special_tokens = self.prompt is not None
        return self


class DetokenizeRequest(Request):
    tokens: TokenIds


def parse_chat_request(raw: bytes, vocab_size: int,
                       sampling_defaults: SamplingDefaults = SamplingDefaults()) -> ChatCompletionRequest:
    return validate(ChatCompletionRequest, parse_json_object(raw), vocab_size=vocab_size,
                    sampling_defaults=sampling_defaults)


def parse_completion_request(raw: bytes, vocab_size: int,
                             sampling_defaults: SamplingDefaults = SamplingDefaults()) -> CompletionRequest:
    return validate(CompletionRequest, parse_json_object(raw), vocab_size=vocab_size,
                    sampling_defaults=sampling_defaults)


def parse_tokenize_request(raw: bytes) -> TokenizeRequest:
    return validate(TokenizeRequest, parse_json_object(raw))


def parse_detokenize_request(raw: bytes, vocab_size: int) -> DetokenizeRequest:
    return validate(DetokenizeRequest, parse_json_object(raw), vocab_size=vocab_size)
