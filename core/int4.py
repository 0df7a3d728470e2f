"""The canonical int4 weight format, shared by every backend (SPEC §3 "int4 weights").

Asymmetric group quantization along the input axis, GROUP = 64 weights per group:

    w[o, i] ~= q[o, i] * scale[o, i // 64] + zero[o, i // 64],   q in 0..15

``zero`` is the value that code 0 stands for (the group's minimum), so dequantizing is one
multiply-add, and MLX's scales/biases are the same numbers. Two codes share a byte: column 2j in
the low nibble, column 2j + 1 in the high nibble, giving ``packed uint8 [out, in/2]``; ``scale``
and ``zero`` are float16 ``[out, in/64]``. Backends may convert this to their own kernel's layout
at load time, but every one of them accepts it.

Pure numpy: the core imports no tensor framework.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 64
LEVELS = 15  # the largest 4-bit code
_ROWS_PER_PASS = 4096  # bounds the float temporaries when quantizing a 151936-row embedding


@dataclass(frozen=True)
class Int4Weight:
    packed: np.ndarray  # uint8 [out, in/2]
    scale: np.ndarray  # float16 [out, in/GROUP]
    zero: np.ndarray  # float16 [out, in/GROUP]

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale.nbytes + self.zero.nbytes


def can_quantize(shape: tuple[int, ...]) -> bool:
    """Only 2-D weights whose input width is a whole number of groups."""
    return len(shape) == 2 and shape[1] % GROUP == 0 and shape[1] > 0


def quantize(weight: np.ndarray) -> Int4Weight:
    """float [out, in] -> Int4Weight; in must be a multiple of GROUP."""
    w = np.asarray(weight)
    if not can_quantize(w.shape):
        raise ValueError(f"int4 needs a 2-D weight whose input width is a multiple of {GROUP}; got shape {w.shape}")
    rows, cols = w.shape
    packed = np.empty((rows, cols // 2), dtype=np.uint8)
    scale = np.empty((rows, cols // GROUP), dtype=np.float16)
    zero = np.empty((rows, cols // GROUP), dtype=np.float16)
    for start in range(0, rows, _ROWS_PER_PASS):
        stop = min(rows, start + _ROWS_PER_PASS)
        packed[start:stop], scale[start:stop], zero[start:stop] = _quantize_rows(w[start:stop])
    return Int4Weight(packed, scale, zero)


def _quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    groups = w.astype(np.float32).reshape(w.shape[0], -1, GROUP)
    low = groups.min(axis=-1)
    high = groups.max(axis=-1)
    zero = low.astype(np.float16)
    # A constant group has no range: any positive scale works, code 0 reproduces it.
    scale = np.where(high > low, (high - low) / LEVELS, 1.0).astype(np.float16)
    scale = np.where(scale > 0, scale, np.float16(np.finfo(np.float16).smallest_subnormal))
    # Round against the float16 numbers actually stored, so the codes absorb their rounding.
    s32 = scale.astype(np.float32)[..., None]
    z32 = zero.astype(np.float32)[..., None]
    codes = np.clip(np.rint((groups - z32) / s32), 0, LEVELS).astype(np.uint8).reshape(w.shape)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, zero


def unpack_codes(packed: np.ndarray) -> np.ndarray:
    """uint8 [out, in/2] -> uint8 codes [out, in]."""
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    return codes


def dequantize(q: Int4Weight) -> np.ndarray:
    """Int4Weight -> float32 [out, in]."""
    rows, cols = q.shape
    codes = unpack_codes(q.packed).reshape(rows, cols // GROUP, GROUP).astype(np.float32)
    w = codes * q.scale.astype(np.float32)[..., None] + q.zero.astype(np.float32)[..., None]
    return w.reshape(rows, cols)


def nbytes(q: Int4Weight) -> int:
    return q.nbytes()


def relative_error(weight: np.ndarray, q: Int4Weight) -> float:
    """Frobenius norm of the quantization error over that of the weight."""
    w = np.asarray(weight, dtype=np.float32)
    return float(np.linalg.norm(w - dequantize(q)) / np.linalg.norm(w))
