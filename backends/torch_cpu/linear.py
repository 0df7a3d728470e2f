"""Float linear layers. Compute is always float32: bf16 matmul on CPUs without AMX/AVX512-BF16
runs ~100x slower than fp32 there, so bf16 only saves memory (weights upcast per call)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.contiguous()
        self.bias = None if bias is None else bias.float()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight if self.weight.dtype == torch.float32 else self.weight.float()
        return F.linear(x, w, self.bias)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight as float32 (an embedding lookup when this is a tied embedding)."""
        return self.weight.index_select(0, ids).float()

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()
