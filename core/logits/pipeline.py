"""The engine's side of logits processing: which processors act on a request, and each row's
merged adjustment. A request no processor applies to keeps an empty state list, and a batch of
such requests reaches the sampler with no adjustment at all."""
from __future__ import annotations

from typing import Any, Sequence

from ..protocols import Completing, LogitsProcessor, LogitsState
from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams


class LogitsPipeline:
    def __init__(self, processors: Sequence[LogitsProcessor]) -> None:
        self.processors = tuple(processors)

    def validate(self, params: SamplingParams) -> None:
        """InvalidRequest from the first processor that cannot serve params."""
        for processor in self.processors:
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
