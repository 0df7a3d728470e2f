"""The torch backend's sampler: the one sampling rule (qwen_serve.sampling.rule) on a numpy view
of the logits."""
from __future__ import annotations

import numpy as np
import torch

from qwen_serve.sampling.numpy_sampler import NumpySampler


def float32_rows(logits: torch.Tensor) -> np.ndarray:
    """Logits [rows, vocab] as float32 numpy: a view, without a copy, when they already are float32."""
    return logits.detach().float().numpy()


class TorchSampler(NumpySampler):
    def __init__(self) -> None:
        super().__init__(float32_rows)
