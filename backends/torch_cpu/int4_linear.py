"""Quantized linear layers: int4 (the canonical format, read in place) and int8 rows (the tied
embedding / lm_head).

Decode (a few rows of x) runs the C kernels in native.py, which read the packed weights once
per call however many rows x has. Prefill (many rows) is compute-bound instead: a tile of the
weight is dequantized into a reused scratch buffer and multiplied by torch's GEMM, so the
unpacking is paid once per tile for hundreds of rows. The tile is bfloat16 on CPUs that multiply
it natively (3x faster than float32 there; the rounding is far below int4's own error), float32
elsewhere. The GEMM stays in torch (not numpy's faster OpenBLAS) because alternating two thread
pools on two cores made the pair slower than either alone. Without a C compiler the tile path
runs for every call (slow but correct).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from qwen_serve.quant.int4 import GROUP, Int4Weight, can_quantize
from qwen_serve.quant.int4 import dequantize as dequantize_int4

from .native import has_fast_bf16_matmul, load_kernels

# Up to this many rows of x go through the bandwidth-bound kernels; more go through dequantized
# tiles. Measured crossover on the Qwen3-0.6B geometry (2 threads): 16 rows against bf16 tiles,
# while against float32 tiles the kernels still won at 96 rows and tied at 512.
KERNEL_ROWS = {torch.bfloat16: 16, torch.float32: 256}
SCRATCH_FLOATS = 1 << 22  # 16 MiB of float32: one weight tile, shared by every layer
ROWS_PER_PASS = 8192  # rows quantized at a time, so a 151936-row embedding needs no full float copy


class Scratch:
    """Buffers reused by every quantized layer of a model for its dequantized tiles (float32, and
    the GEMM's dtype when that differs), allocated on first use so a model that only decodes never
    holds them; and from how many rows of x the tiles beat the kernels."""

    def __init__(self, floats: int = SCRATCH_FLOATS, gemm_dtype: torch.dtype | None = None,
                 kernel_rows: int | None = None) -> None:
        self.floats = floats
        self.gemm_dtype = gemm_dtype or (torch.bfloat16 if has_fast_bf16_matmul() else torch.float32)
        self.kernel_rows = KERNEL_ROWS[self.gemm_dtype] if kernel_rows is None else kernel_rows
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def rows_per_tile(self, in_features: int) -> int:
        return max(1, self.floats // in_features)

    def tile(self, rows: int, in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buffer = self.buffers.get(dtype)
        if buffer is None or buffer.numel() < rows * in_features:
            buffer = self.buffers[dtype] = torch.empty(max(self.floats, rows * in_features), dtype=dtype)
        return buffer[: rows * in_features].view(rows, in_features)


class _QuantizedLinear:
    """y = x @ W.T + b: the small-batch kernel when there is one, else dequantized tiles + BLAS.

    A subclass sets out_features, in_features, bias, scratch and kernels, and provides
    _kernel_matmul(x, y) and _fill_tile(start, stop, out), plus _prepare_tiled(x) when its tiles
    hold the columns in another order than x.
    """

    out_features: int
    in_features: int
    bias: torch.Tensor | None
    scratch: Scratch
    kernels: object | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if self.kernels is not None and x2.shape[0] <= self.scratch.kernel_rows:
            y = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32)
            self._kernel_matmul(x2, y)
        else:
            y = self._tiled_matmul(self._prepare_tiled(x2))
        if self.bias is not None:
            y += self.bias
        return y.view(*lead, self.out_features)

    def _prepare_tiled(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _tiled_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W.T with W dequantized one tile of rows at a time into the shared scratch."""
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        dtype = self.scratch.gemm_dtype
        xg = x.to(dtype)
        step = self.scratch.rows_per_tile(self.in_features)
        for start in range(0, self.out_features, step):
            stop = min(self.out_features, start + step)
            tile = self.scratch.tile(stop - start, self.in_features)
            self._fill_tile(start, stop, tile)
            if dtype != torch.float32:
                tile = self.scratch.tile(stop - start, self.in_features, dtype).copy_(tile)
            y[:, start:stop] = F.linear(xg, tile)
        return y


class Int4Linear(_QuantizedLinear):
    """W in the canonical int4 format, kept exactly as quantized (the kernels read it in place)."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None, scratch: Scratch | None = None) -> None:
        self.weight = weight
        self.packed = torch.from_numpy(weight.packed)  # shares memory with the canonical arrays
        self.scale_bits = torch.from_numpy(weight.scale.view(np.int16))
        self.zero_bits = torch.from_numpy(weight.zero.view(np.int16))
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()
        self.scratch = scratch or Scratch()
        self.kernels = load_kernels()

    def _kernel_matmul(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.kernels.q4_matmul(x.data_ptr(), x.shape[0], self.in_features, self.packed.data_ptr(),
                               self.scale_bits.data_ptr(), self.zero_bits.data_ptr(), self.out_features,
                               y.data_ptr())

    def _prepare_tiled(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            return x
        xp = torch.empty_like(x)  # the native tiles order each group's columns evens, then odds
        self.kernels.permute_groups(x.data_ptr(), x.shape[0], self.in_features, xp.data_ptr())
        return xp

    def _fill_tile(self, start: int, stop: int, out: torch.Tensor) -> None:
        if self.kernels is None:
            out.copy_(self.lookup(torch.arange(start, stop)))
            return
        self.kernels.q4_dequant_split(self.packed[start].data_ptr(), self.scale_bits[start].data_ptr(),
                                      self.zero_bits[start].data_ptr(), stop - start, self.in_features,
                                      out.data_ptr())

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows (an embedding lookup when this weight is a tied embedding)."""
        packed = self.packed.index_select(0, ids)
        codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # low nibble first
        scale = self.scale_bits.index_select(0, ids).view(torch.float16).float()
        zero = self.zero_bits.index_select(0, ids).view(torch.float16).float()
        groups = codes.view(len(ids), -1, GROUP).float()
        return (groups * scale[..., None] + zero[..., None]).view(len(ids), self.in_features)

    def dequantize(self) -> torch.Tensor:
        return torch.from_numpy(dequantize_int4(self.weight))

    def nbytes(self) -> int:
        return self.weight.nbytes() + (0 if self.bias is None else self.bias.numel() * 4)


class Int8Linear(_QuantizedLinear):
    """W as int8 rows with one float32 scale per row (symmetric), quantized from a float weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scratch: Scratch | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.codes = torch.empty(weight.shape, dtype=torch.int8)
        self.scale = torch.empty(self.out_features, dtype=torch.float32)
        for start in range(0, self.out_features, ROWS_PER_PASS):  # bounded float temporaries
            w = weight[start:start + ROWS_PER_PASS].float()
            amax = w.abs().amax(dim=1)
            scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
            self.scale[start:start + ROWS_PER_PASS] = scale
            self.codes[start:start + ROWS_PER_PASS] = torch.round(w / scale[:, None]).clamp_(-127, 127)
        self.bias = None if bias is None else bias.float()
        self.scratch = scratch or Scratch()
        self.kernels = load_kernels() if self.in_features % GROUP == 0 else None

    def _kernel_matmul(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.kernels.q8_matmul(x.data_ptr(), x.shape[0], self.in_features, self.codes.data_ptr(),
                               self.scale.data_ptr(), self.out_features, y.data_ptr())

    def _fill_tile(self, start: int, stop: int, out: torch.Tensor) -> None:
        torch.mul(self.codes[start:stop], self.scale[start:stop, None], out=out)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.codes.index_select(0, ids).float() * self.scale.index_select(0, ids)[:, None]

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.scale[:, None]

    def nbytes(self) -> int:
        return self.codes.numel() + self.scale.numel() * 4 + (0 if self.bias is None else self.bias.numel() * 4)


def quantizable(weight: torch.Tensor) -> bool:
    return can_quantize(tuple(weight.shape))
