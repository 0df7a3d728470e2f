"""Per-request generation settings, validated once at construction.

The same fields serve the HTTP API (qwen_serve.openai maps request JSON onto them) and the
offline LLM API. The order in which they act on a row of logits is fixed: logit_bias
and penalties, then the grammar mask of ``structured``, then temperature, top-k, softmax, top-p,
min-p, and the draw from the request's own generator (sampling/rule.py, for every backend).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence, get_args

from .request_args import StoredArgs, freeze_request_args, thaw_request_args

StructuredKind = Literal["json_object", "json_schema", "tool_calls", "regex", "choice", "grammar"]
ToolCallFormat = Literal["hermes", "qwen3_xml"]  # the forms a tool_calls constraint can write
TOOL_CALL_FORMATS: tuple[str, ...] = get_args(ToolCallFormat)


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint every output token must keep: the text stays a prefix of a valid document.

    - ``json_object``: any JSON object.
    - ``json_schema``: JSON valid against ``schema`` (JSON text, so the value is hashable).
    - ``tool_calls``: one or more calls, each naming one of ``tools`` (name, parameters schema as
      JSON text) with arguments valid against its schema; a single tool means that function is
      required. ``tool_format`` is the form the calls take, the one the model's tool parser reads:
      ``hermes`` (Qwen3's ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``) or
      ``qwen3_xml`` (Qwen3-Coder's ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\n...``).

    - ``regex``: text matching the regular expression ``schema`` (Rust regex syntax).
    - ``choice``: exactly one of the strings of ``schema`` (a JSON array).
    - ``grammar``: text of the Lark grammar ``schema`` (llguidance's Lark dialect).

    ``after_token_id``: the constraint starts only once this token has been generated (Qwen3's
    ``</think>`` while a think block is open); None means from the first token. ``field``: the
    request field it came from, which a 400 about it names.
    """

    kind: StructuredKind
    schema: str | None = None
    tools: tuple[tuple[str, str], ...] = ()
    after_token_id: int | None = None
    tool_format: ToolCallFormat = "hermes"
    field: str = "response_format"
    single_call: bool = False  # tool_calls: exactly one call (parallel_tool_calls false)

    def __post_init__(self) -> None:
        if self.kind not in get_args(StructuredKind):
            raise ValueError(f"unknown structured output kind {self.kind!r}")
        if self.kind in ("json_schema", "regex", "choice", "grammar") and not isinstance(self.schema, str):
            raise ValueError(f"a {self.kind} constraint needs its text")
        if self.kind == "tool_calls" and not self.tools:
            raise ValueError("a tool_calls constraint needs at least one tool")
        if self.tool_format not in TOOL_CALL_FORMATS:
            raise ValueError(f"unknown tool call format {self.tool_format!r} (one of {', '.join(TOOL_CALL_FORMATS)})")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any], after_token_id: int | None = None) -> "StructuredOutput":
        # not sort_keys: the grammar emits properties in the schema's order, which is the caller's
        return cls("json_schema", json.dumps(schema), after_token_id=after_token_id)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0, top_p 1.0 and min_p 0 disable those filters.

    n > 1 asks for n choices of one prompt: the prompt is prefilled once and the choices fork
    its KV blocks (copy-on-write); with a seed, choice i draws from seed + i, so each choice is
    reproducible alone. presence_penalty / frequency_penalty follow OpenAI's definitions over the
    generated tokens; repetition_penalty the CTRL/HF one over prompt and generated tokens.
    logit_bias maps token ids to a bias in [-100, 100] (kept as sorted (id, bias) pairs, so
    params stay hashable). stop_token_ids end generation like EOS (the token is not part of the
    text); min_tokens suppresses EOS, stop tokens and stop strings until that many tokens exist;
    ignore_eos generates through EOS until max_tokens. A structured-output document that is
    complete ends generation whatever min_tokens or ignore_eos say (nothing else may follow).
    extra_args maps names to JSON values for the plugins that claim those names (HTTP
    ``vllm_xargs``; a name no loaded plugin claims is refused when the request is checked);
    kept as sorted (name, JSON text) pairs, read back with ``request_args``. thinking_budget
    caps the tokens of a think block (one the prompt leaves open, or one the reply opens): at the
    cap the engine writes Qwen's early-exit sentence and closes the block, and the answer follows.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: Sequence[str] | str = ()
    stop_token_ids: Sequence[int] = ()
    max_tokens: int = 256
    min_tokens: int = 0
    logprobs: int | None = None
    ignore_eos: bool = False
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = ()  # stored as sorted (id, bias) pairs
    structured: StructuredOutput | None = None
    speculative: bool = True  # False: never speculate for this request, even on a server that does
    extra_args: Mapping[str, Any] | StoredArgs = ()  # stored as sorted (name, JSON text) pairs
    thinking_budget: int | None = None  # tokens a think block may take before the engine closes it

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens], got {self.min_tokens!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if not isinstance(self.repetition_penalty, (int, float)) or not (
                math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        bias = dict(self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias)
        for token, value in bias.items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not isinstance(value, (int, float)) or not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {value!r}")
        object.__setattr__(self, "logit_bias", tuple(sorted((int(k), float(v)) for k, v in bias.items())))
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ValueError("structured must be a StructuredOutput")
        object.__setattr__(self, "extra_args", freeze_request_args(self.extra_args))
        if self.thinking_budget is not None and (not isinstance(self.thinking_budget, int) or self.thinking_budget < 0):
            raise ValueError(f"thinking_budget must be an integer >= 0, got {self.thinking_budget!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def extra_arg_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.extra_args)

    def request_args(self, names: Iterable[str]) -> dict[str, Any]:
        """The values of those of ``names`` this request carries, as plain JSON values."""
        return thaw_request_args(self.extra_args, names)

    @property
    def penalized(self) -> bool:
        """Whether any penalty or bias changes the logits before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)
