"""The MLX backend's sampler: the one sampling rule (qwen_serve.sampling.rule) on a numpy copy of
the logits."""
from __future__ import annotations

import numpy as np

from qwen_serve.sampling.numpy_sampler import NumpySampler

from .mx import mx


def float32_rows(logits: mx.array) -> np.ndarray:
    """Logits [rows, vocab] as float32 numpy (a copy: numpy reads the evaluated MLX buffer)."""
    return np.array(logits.astype(mx.float32))


class MLXSampler(NumpySampler):
    def __init__(self) -> None:
        super().__init__(float32_rows)
