"""The sampling fields chat and legacy completions share, mapped onto SamplingParams with
OpenAI's ranges (vLLM's for the fields OpenAI does not have: top_k, min_p, repetition_penalty,
stop_token_ids, min_tokens, ignore_eos, vllm_xargs)."""
from __future__ import annotations

import math
from typing import Any

from ..chat.fields import boolean, integer, mapping, number, token_ids
from ..errors import InvalidRequest
from ..sampling.params import SamplingParams

MAX_N = 128  # OpenAI's limit; whether n choices fit the KV pool is the engine's check
MAX_STOPS = 16


def parse_sampling(body: dict[str, Any], *, vocab_size: int, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """Every field but ``structured`` (that needs the rendered prompt: qwen_serve.openai.structured)."""
    min_tokens = integer(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise InvalidRequest(f"'min_tokens' ({min_tokens}) must not exceed max_tokens ({max_tokens})",
                             param="min_tokens")
    fields = dict(
        temperature=number(body, "temperature", 0.0, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=integer(body, "top_k", 0, 0),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        seed=integer(body, "seed", None, -(2**63), 2**63 - 1),
        stop=_stop(body),
        stop_token_ids=tuple(_stop_token_ids(body, vocab_size)),
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        logprobs=logprobs,
        ignore_eos=boolean(body, "ignore_eos", False),
        n=integer(body, "n", 1, 1, MAX_N),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, math.inf, low_open=True),
        logit_bias=_logit_bias(body, vocab_size),
        extra_args=mapping(body, "vllm_xargs") or {},  # which plugin takes each name: the engine's check
    )
    try:
        return SamplingParams(**fields)
    except InvalidRequest:  # it names its field already
        raise
    except ValueError as exc:  # a rule of SamplingParams itself
        raise InvalidRequest(str(exc)) from None


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise InvalidRequest(f"'stop' must be a non-empty string or an array of up to {MAX_STOPS} of them",
                             param="stop")
    return tuple(stops)


def _stop_token_ids(body: dict, vocab_size: int) -> list[int]:
    value = body.get("stop_token_ids")
    if value is None:
        return []
    return token_ids(value, "stop_token_ids", vocab_size, allow_empty=True)


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    """{"token id as a string": bias in [-100, 100]}, as OpenAI sends it."""
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'logit_bias' must be an object mapping token ids to biases", param="logit_bias")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise InvalidRequest(f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {key!r}",
                                 param="logit_bias")
        bias[int(key)] = number(value, key, 0.0, -100.0, 100.0, where="logit_bias")
    return bias
