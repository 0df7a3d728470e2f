"""GGUF Q4_0 blocks straight into the canonical int4 format, no float weight in between.

Q4_0 stores 32 weights per block as one float16 scale d and 4-bit codes q: w = d (q - 8), the
largest-magnitude weight at q = 0 (llama.cpp takes d = that weight / -8). Our groups are 64
weights with a scale and a zero, so one group holds two blocks. The block of larger |d| keeps its
weights exactly: step |d|, zero -8|d| (d > 0: code q) or -7|d| (d < 0, w = |d| (8 - q): code 15 - q;
-7|d| rounds to float16, moving them by at most 0.35% of a step). The other block's weights, at most as large, are
rounded onto that grid (its one weight of 8 |d'| may be clipped to the grid's 7 |d|). On Gaussian weights this is about half the error of requantizing the
dequantized blocks with the int4 search (quant.int4.quantize), measured in tests/test_gguf_int4.py,
and ~20 times faster (no search, no float copy of the tensor).
"""
from __future__ import annotations

import numpy as np

from .int4 import GROUP, LEVELS, Int4Weight

BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 2 + BLOCK // 2  # float16 d, then 16 bytes: weight j in the low nibble of byte j, j + 16 in the high
ROWS_PER_PASS = 1024  # bounds the temporaries (a 151,936-row table)


def can_convert(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] % GROUP == 0 and shape[1] > 0


def int4_from_q4_0(raw: np.ndarray, shape: tuple[int, int]) -> Int4Weight:
    """raw: the tensor's Q4_0 bytes (any shape holding rows x cols / 32 blocks, row-major);
    shape: (rows, cols) in numpy order, cols a multiple of 64."""
    rows, cols = shape
    if not can_convert(shape):
        raise ValueError(f"Q4_0 to int4 needs a 2-D weight whose width is a multiple of {GROUP}; got {shape}")
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // BLOCK, BLOCK_BYTES)
    packed = np.empty((rows, cols // 2), dtype=np.uint8)
    scale = np.empty((rows, cols // GROUP), dtype=np.float16)
    zero = np.empty((rows, cols // GROUP), dtype=np.float16)
    for start in range(0, rows, ROWS_PER_PASS):
        stop = min(rows, start + ROWS_PER_PASS)
        packed[start:stop], scale[start:stop], zero[start:stop] = _convert_rows(blocks[start:stop])
    return Int4Weight(packed, scale, zero)


def _convert_rows(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, count = blocks.shape[:2]
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32).reshape(rows, count // 2, 2)
    nibbles = blocks[..., 2:]
    q = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1).reshape(rows, count // 2, 2, BLOCK)
    larger = np.take_along_axis(d, np.abs(d).argmax(axis=-1)[..., None], axis=-1)[..., 0]  # [rows, groups]
    step = np.abs(larger)
    stored_zero = np.where(larger > 0, -8 * step, -7 * step).astype(np.float16)
    stored_step = np.where(step > 0, step, np.float32(np.finfo(np.float16).smallest_subnormal)).astype(np.float16)
    codes = q.astype(np.float32)  # [rows, groups, 2, 32]: the weights, then their codes on the group's grid
    codes -= 8
    codes *= d[..., None]
    codes -= stored_zero.astype(np.float32)[..., None, None]
    codes /= stored_step.astype(np.float32)[..., None, None]
    np.rint(codes, out=codes)
    np.minimum(codes, LEVELS, out=codes)
    np.maximum(codes, 0, out=codes)
    codes = codes.astype(np.uint8).reshape(rows, -1)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), stored_step, stored_zero
