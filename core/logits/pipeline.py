"""The engine's side of logits processing: which processors act on a request, and each row's
merged adjustment. A request no processor applies to keeps an empty state list, and a batch of
such requests reaches the sampler with no adjustment at all. A request's own arguments for
plugins (SamplingParams.extra_args) are checked here too: each name must be claimed by a
processor (TakesRequestArgs), which checks the values."""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import InvalidRequest
from ..protocols import Completing, LogitsProcessor, LogitsState, TakesRequestArgs
from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams
from ..sampling.request_args import PARAM


class LogitsPipeline:
    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = tuple(processors)
        self.arg_claims = claim_request_args(self.processors)

    def validate(self, params: SamplingParams) -> None:
        """InvalidRequest for an argument no processor claims, else from the first processor
        that cannot serve params."""
        unclaimed = [name for name in params.extra_arg_names if name not in self.arg_claims]
        if unclaimed:
            offered = ", ".join(sorted(self.arg_claims)) or "none"
            raise InvalidRequest(f"{PARAM}: no loaded plugin takes {unclaimed[0]!r} (the loaded ones take: {offered})",
                                 param=PARAM)
        for processor in self.processors:
            if isinstance(processor, TakesRequestArgs):
                args = params.request_args(processor.request_arg_keys)
                if args:
                    processor.check_request_args(args)
            processor.validate(params)

    def start(self, request: Any) -> list[LogitsState]:
        """The states of the processors that apply to a request (one choice)."""
        return [s for s in (p.start(request) for p in self.processors) if s is not None]

    @staticmethod
    def adjustment(request: Any, states: Sequence[LogitsState]) -> LogitsAdjustment | None:
        parts = [a for a in (s.adjust(request) for s in states) if a is not None]
        return LogitsAdjustment.merge(parts) if parts else None

    @staticmethod
    def accept(states: Sequence[LogitsState], token_id: int) -> bool:
        """Advance every state; True when one of them says the request is complete."""
        for state in states:
            state.accept(token_id)
        return any(isinstance(s, Completing) and s.is_complete() for s in states)


def claim_request_args(processors: Sequence[LogitsProcessor]) -> dict[str, LogitsProcessor]:
    """Argument name -> the processor that takes it; a name claimed twice is a plugin clash."""
    claims: dict[str, LogitsProcessor] = {}
    for processor in processors:
        if not isinstance(processor, TakesRequestArgs):
            continue
        for name in processor.request_arg_keys:
            if name in claims:
                raise ValueError(f"request argument {name!r} is claimed by two logits processors "
                                 f"({type(claims[name]).__name__} and {type(processor).__name__})")
            claims[name] = processor
    return claims
