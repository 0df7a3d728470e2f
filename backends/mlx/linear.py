"""Linear layers on MLX: float weights, int4 weights converted from the canonical format, and
int8 weights for the embedding / tied head.

Compute is float32. The canonical int4 layout (``qwen_serve.quant.int4``) is already MLX's affine
4-bit layout: code j of a row sits in bits 4 * (j % 8) of 32-bit word j // 8, and a weight is
``code * scale + bias`` with one scale and bias per 64 inputs. So the packed bytes are
reinterpreted as uint32 words (little-endian) and scale/zero become scales/biases as they are.
"""
from __future__ import annotations

import sys
from typing import Union

import numpy as np

from qwen_serve.quant.int4 import GROUP, Int4Weight

from .mx import mx

INT4_BITS = 4
# From this many rows of x an int4 layer dequantizes its weight and multiplies with sgemm:
# mlx[cpu]'s quantized_matmul costs each row a pass over the weight (one 1536x576 int4 layer,
# OpenBLAS bound, Zen 4: 0.9 / 3.1 / 13.5 / 103 ms at 1 / 4 / 16 / 128 rows, against 3.1 / 2.2 /
# 1.5 / 3.3 ms dequantized).
DEQUANTIZE_FROM_ROWS = 4


class DenseLinear:
    def __init__(self, weight: mx.array, bias: mx.array | None = None) -> None:
        self.weight = weight
        self.bias = None if bias is None else bias.astype(mx.float32)
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: mx.array) -> mx.array:
        w = self.weight if self.weight.dtype == mx.float32 else self.weight.astype(mx.float32)
        y = x @ w.T  # a transposed view: BLAS reads the [out, in] weight as it is
        return y if self.bias is None else y + self.bias

    def rows(self, ids: mx.array) -> mx.array:
        """float32 rows (an embedding lookup in the same weight)."""
        return self.weight[ids].astype(mx.float32)

    def dequantize(self) -> mx.array:
        return self.weight

    def with_rows(self, ids: mx.array) -> "DenseLinear":
        """A layer computing only output rows ``ids`` (a head narrowed to part of the vocabulary)."""
        return DenseLinear(self.weight[ids], None if self.bias is None else self.bias[ids])

    def nbytes(self) -> int:
        return self.weight.nbytes


class QuantizedLinear:
    """y = x @ W.T with W in MLX's affine group layout, through mx.quantized_matmul: int4 from the
    canonical format, or int8 (the embedding / tied head) quantized by MLX itself."""

    def __init__(self, words: mx.array, scales: mx.array, biases: mx.array, bits: int, bias: mx.array | None = None) -> None:
        self.weight, self.scales, self.biases, self.bits = words, scales, biases, bits
        self.out_features, self.in_features = words.shape[0], words.shape[1] * 32 // bits
        self.bias = None if bias is None else bias.astype(mx.float32)

    @classmethod
    def from_canonical(cls, q: Int4Weight, bias: mx.array | None = None) -> "QuantizedLinear":
        if sys.byteorder != "little":
            raise RuntimeError("int4 conversion to MLX words assumes a little-endian host")
        words = mx.array(np.ascontiguousarray(q.packed).view(np.uint32))  # [out, in / 8]
        # float16 scales and zeros: the exact canonical values
        return cls(words, mx.array(q.scale), mx.array(q.zero), INT4_BITS, bias)

    @classmethod
    def int8(cls, weight: mx.array, bias: mx.array | None = None) -> "QuantizedLinear":
        words, scales, biases = mx.quantize(weight.astype(mx.float32), group_size=GROUP, bits=8)
        return cls(words, scales, biases, 8, bias)

    def __call__(self, x: mx.array) -> mx.array:
        # int4 projections: unpack once, then one sgemm; not the int8 vocabulary table (a float copy
        # of it per call would be 620 MB for Qwen3-0.6B, and the head sees few rows per step)
        if self.bits == INT4_BITS and x.size >= DEQUANTIZE_FROM_ROWS * self.in_features:
            y = x @ self.dequantize().T
        else:
            y = mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                    group_size=GROUP, bits=self.bits)
        return y if self.bias is None else y + self.bias

    def rows(self, ids: mx.array) -> mx.array:
        """Dequantized float32 rows (an embedding lookup in the same weight)."""
        return self._dequantize(self.weight[ids], self.scales[ids], self.biases[ids])

    def dequantize(self) -> mx.array:
        return self._dequantize(self.weight, self.scales, self.biases)

    def with_rows(self, ids: mx.array) -> "QuantizedLinear":
        """A layer computing only output rows ``ids``: their words, scales and biases as they are."""
        return QuantizedLinear(self.weight[ids], self.scales[ids], self.biases[ids], self.bits,
                               None if self.bias is None else self.bias[ids])

    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes + self.biases.nbytes

    def _dequantize(self, words: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
        # float32 scales, so the result is float32 (with float16 ones it would be rounded to float16)
        return mx.dequantize(words, scales.astype(mx.float32), biases.astype(mx.float32),
                             group_size=GROUP, bits=self.bits)



Linear = Union[DenseLinear, QuantizedLinear]
