"""The prefill path of a packed weight (int4, int8, blocked bf16): a tile of its rows unpacked into
a scratch buffer and multiplied by torch's GEMM in float32 or bfloat16, so the unpacking is paid
once per tile for all the rows of x. Which layers take it for how many rows is their PathPlan."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from . import blocked_layout as blocked
from .row_buckets import pad_rows

SCRATCH_FLOATS = 1 << 22  # 16 MiB of float32: one weight tile, shared by every layer
TILE_PAD = 16  # elements at the end of each row of a transposed tile (see transposed_tile)


class Scratch:
    """Buffers reused by every packed layer of a model for its tiles (float32, and the GEMM's
    dtype when that differs), allocated on first use so a model that only decodes never holds
    them."""

    def __init__(self, floats: int = SCRATCH_FLOATS) -> None:
        self.floats = floats
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def rows_per_tile(self, in_features: int) -> int:
        """Whole blocks of 16 rows, so a tile of a blocked layout starts at a block."""
        return max(1, self.floats // in_features // blocked.BLOCK) * blocked.BLOCK

    def tile(self, rows: int, in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buffer = self.buffers.get(dtype)
        if buffer is None or buffer.numel() < rows * in_features:
            buffer = self.buffers[dtype] = torch.empty(max(self.floats, rows * in_features), dtype=dtype)
        return buffer[: rows * in_features].view(rows, in_features)


def tiled_matmul(x: torch.Tensor, out_features: int, rows_per_tile: int, dtype: torch.dtype,
                 tile: Callable[[int, int, torch.dtype], torch.Tensor]) -> torch.Tensor:
    """y = x @ W.T, float32, with tile(start, stop, dtype) giving rows [start, stop) of W."""
    xg = pad_rows(x.to(dtype))  # oneDNN: a bounded set of shapes (row_buckets.py)
    y = torch.empty(xg.shape[0], out_features, dtype=torch.float32)
    for start in range(0, out_features, rows_per_tile):
        stop = min(out_features, start + rows_per_tile)
        y[:, start:stop] = F.linear(xg, tile(start, stop, dtype))
    return y[: x.shape[0]]


def transposed_tile(scratch: Scratch, in_features: int, start: int, stop: int, dtype: torch.dtype,
                    unpack: Callable[[int, int, torch.Tensor], None]) -> torch.Tensor:
    """Rows [start, stop) of a blocked weight as [stop - start, K] in dtype: unpack(first, last,
    out) writes blocks [first, last) transposed into out [K, >= 16 (last - first)], which GEMM
    takes as is (the transpose back is a view)."""
    first, last = start // blocked.BLOCK, -(-stop // blocked.BLOCK)
    # rows TILE_PAD apart beyond the tile's width: at a power-of-two stride the kernel's stores
    # to 64 rows at a time all fell in the same cache sets (bf16: 3.4 -> 10.3 G weights/s)
    tile = scratch.tile(in_features, (last - first) * blocked.BLOCK + TILE_PAD, dtype)
    unpack(first, last, tile)
    return tile[:, : stop - start].t()
