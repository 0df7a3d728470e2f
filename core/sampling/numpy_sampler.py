"""A Sampler (and DraftVerifying) for any backend, over the one sampling rule: the backend gives
only the function that turns its logits into float32 numpy rows."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import rule
from .adjustment import BatchAdjustment
from .params import SamplingParams


class NumpySampler:
    def __init__(self, float32_rows: Callable[[Any], np.ndarray]) -> None:
        self.float32_rows = float32_rows  # a backend's logits [rows, vocab] -> float32 numpy

    def make_generator(self, seed: int) -> np.random.Generator:
        return rule.make_generator(seed)

    def sample(self, logits: Any, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator],
               adjustment: BatchAdjustment | None = None) -> rule.SampleResult:
        return rule.sample(self.float32_rows(logits), params, generators, adjustment)

    def verify_draft(self, logits: Any, params: SamplingParams, generator: np.random.Generator,
                     draft: Sequence[int]) -> list[int]:
        return rule.verify_draft(self.float32_rows(logits), params, generator, draft)
