"""Logits processors: per-request states over a batch, the adjustments they return, and the
request arguments a plugin may claim."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams


class LogitsRequest(Protocol):
    """What a logits processor may read of a request (the engine's Sequence is one)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams


@runtime_checkable
class LogitsState(Protocol):
    """One request's (one choice's) state for one processor."""

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        """The change to the next token's logits; None changes nothing this step."""

    def accept(self, token_id: int) -> None:
        """Advance past a generated token (raise if the token breaks the state: the request fails)."""


@runtime_checkable
class Completing(Protocol):
    """A state that knows when nothing but EOS may follow (a grammar whose document is whole):
    the engine then ends the request with finish_reason "stop" (also under min_tokens or ignore_eos)."""

    def is_complete(self) -> bool: ...


@runtime_checkable
class LogitsProcessor(Protocol):
    """Restricts or biases next-token logits for the requests it chooses (penalties, logit_bias,
    a grammar's mask, or a plugin's own rule; hook ``register_logits_processors``).

    How it works: for every request (every choice of n) the engine calls ``start``; a processor
    that does not apply returns None and costs nothing more. Before each sampling step every live
    state returns a LogitsAdjustment of numpy arrays (token ids with penalty factors, token ids
    with additive biases, an allowed-token bitmask); the engine merges the batch's rows into one
    BatchAdjustment and the backend's sampler applies it to its own tensors, so torch and MLX
    share every processor. After each generated token every state of that request gets
    ``accept``. State follows the request's tokens, never the KV cache, so preemption and
    recomputation leave it right. The stages run in a fixed order whatever order
    processors register in: penalties, biases, masks, then temperature and the filters.
    """

    def validate(self, params: SamplingParams) -> None:
        """Raise InvalidRequest, naming the part, when params ask this processor for something it
        cannot do (e.g. a schema it cannot compile). Called from any thread; changes nothing."""

    def start(self, request: LogitsRequest) -> LogitsState | None:
        """The request's state, or None when this processor does not apply to it."""


@runtime_checkable
class TakesRequestArgs(Protocol):
    """A logits processor that a request steers with arguments of its own: the request names them
    in SamplingParams.extra_args (HTTP ``vllm_xargs``), and the processor reads them in ``start``
    with ``request.params.request_args(self.request_arg_keys)``. The engine refuses a request
    carrying a name no processor claims; each name is claimed by one processor at most."""

    request_arg_keys: tuple[str, ...]

    def check_request_args(self, args: dict[str, Any]) -> None:
        """Raise InvalidRequest with param "vllm_xargs" when a value is wrong. args holds the
        claimed names the request carries (at least one). Called from any thread; changes nothing."""
