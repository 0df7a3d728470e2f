"""The canonical int4 weight format, shared by every backend.

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

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

GROUP = 64
LEVELS = 15  # the largest 4-bit code
_ROWS_PER_PASS = 256  # rows per block: small enough for the cache, and bounds the temporaries


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

    def take_rows(self, rows: np.ndarray) -> "Int4Weight":
        """These output rows (each row's codes and groups are its own)."""
        return Int4Weight(self.packed[rows], self.scale[rows], self.zero[rows])


def concatenate(weights: list[Int4Weight]) -> Int4Weight:
    """The weights' rows stacked: one weight computing every part's outputs side by side."""
    return Int4Weight(*(np.concatenate([getattr(w, field) for w in weights]) for field in ("packed", "scale", "zero")))


def can_quantize(shape: tuple[int, ...]) -> bool:
    """Only 2-D weights whose input width is a whole number of groups."""
    return len(shape) == 2 and shape[1] % GROUP == 0 and shape[1] > 0


def quantize(weight: np.ndarray, importance: np.ndarray | None = None) -> Int4Weight:
    """float [out, in] -> Int4Weight; in must be a multiple of GROUP.

    ``importance`` ([in], non-negative) says how much an error in each input column costs: the
    mean square of the activations that column multiplies, measured on calibration text (see
    qwen_serve.quant.calibration). Without it every column counts the same.
    """
    w = np.asarray(weight)
    if not can_quantize(w.shape):
        raise ValueError(f"int4 needs a 2-D weight whose input width is a multiple of {GROUP}; got shape {w.shape}")
    rows, cols = w.shape
    if importance is None:
        importance = np.ones(cols, dtype=np.float32)
    importance = np.asarray(importance, dtype=np.float32)
    if importance.shape != (cols,) or not np.all(np.isfinite(importance)) or np.any(importance < 0):
        raise ValueError(f"importance must be {cols} finite non-negative numbers, one per input column")
    packed = np.empty((rows, cols // 2), dtype=np.uint8)
    scale = np.empty((rows, cols // GROUP), dtype=np.float16)
    zero = np.empty((rows, cols // GROUP), dtype=np.float16)
    # Only ratios matter, so normalize (no overflow in the sums), and keep a floor: a column the
    # calibration text left silent may still carry signal on other inputs.
    mean = float(importance.mean())
    column_weights = (importance / mean if mean > 0 else importance) + IMPORTANCE_FLOOR
    column_weights = column_weights.astype(np.float32).reshape(1, cols // GROUP, GROUP)

    def quantize_block(start: int) -> None:
        stop = min(rows, start + _ROWS_PER_PASS)
        packed[start:stop], scale[start:stop], zero[start:stop] = _quantize_rows(w[start:stop], column_weights)

    # numpy releases the GIL inside its loops, so blocks of rows run in parallel on threads.
    starts = range(0, rows, _ROWS_PER_PASS)
    with ThreadPoolExecutor(max_workers=min(len(starts), len(os.sched_getaffinity(0)))) as pool:
        list(pool.map(quantize_block, starts))
    return Int4Weight(packed, scale, zero)


# Candidate grids per group: step = (max - min) / (LEVELS + offset). Offset 0 is the min-max grid
# (tried first, so it wins ties); positive offsets give finer steps that clip the largest values,
# negative ones coarser steps centred on the range. Each is also tried refitted once. With the
# calibration importance, this took SmolLM2's top-5 agreement with float from 71% (min-max alone)
# to 83%; more candidates or refits gained < 1 point.
STEP_OFFSETS = (0.0, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 3.0)
IMPORTANCE_FLOOR = 1e-3  # relative to the mean importance


def _quantize_rows(w: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, the (scale, zero) with the least importance-weighted squared error among the
    candidate grids, each refitted once by weighted least squares for the codes it chose."""
    groups = w.astype(np.float32).reshape(w.shape[0], -1, GROUP)
    low = groups.min(axis=-1)
    # The search runs on each group minus its minimum: far from zero, the expanded sums of
    # _GroupSums would otherwise cancel in float32. Zeros below are relative to low, but always
    # the float16 number that will be stored, minus low.
    centred = groups - low[..., None]
    sums = _GroupSums(centred, h)
    span = centred.max(axis=-1)
    best_error = best_scale = best_zero = None
    for offset in STEP_OFFSETS:
        scale = _stored_scale(np.where(span > 0, span / (LEVELS + offset), 1.0))
        zero = _stored(low + min(offset, 0.0) / 2 * scale) - low
        code_sums = sums.over(_codes(centred, scale, zero))
        # the grid as it is, then refitted: rounding the refitted zero to float16 can undo the gain
        refit_scale, refit_zero = sums.refit(code_sums, scale, zero, low)
        for s, z, error in ((scale, zero, sums.error(code_sums, scale, zero)),
                            (refit_scale, refit_zero, sums.error(sums.over(_codes(centred, refit_scale, refit_zero)),
                                                                 refit_scale, refit_zero))):
            if best_error is None:
                best_error, best_scale, best_zero = error, s, z
            else:
                better = error < best_error
                best_error = np.where(better, error, best_error)
                best_scale = np.where(better, s, best_scale)
                best_zero = np.where(better, z, best_zero)
    stored_zero = (best_zero + low).astype(np.float16)
    codes = _codes(groups, best_scale, stored_zero.astype(np.float32)).astype(np.uint8).reshape(w.shape)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), best_scale.astype(np.float16), stored_zero


def _stored(x: np.ndarray) -> np.ndarray:
    """float16 as stored, back in float32, so codes and errors see the numbers kept."""
    return np.asarray(x).astype(np.float16).astype(np.float32)


def _stored_scale(x: np.ndarray) -> np.ndarray:
    """A step that would round to zero (a group spanning less than float16's resolution) becomes
    the smallest positive float16: code 0 then reproduces the group's minimum."""
    stored = _stored(x)
    return np.where(stored > 0, stored, np.float32(np.finfo(np.float16).smallest_subnormal))


def _codes(groups: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    codes = groups - zero[..., None]
    codes /= scale[..., None]
    return np.clip(np.rint(codes, out=codes), 0, LEVELS, out=codes)


class _GroupSums:
    """The weighted sums of one block of groups that do not depend on the codes, so each
    candidate grid costs only the sums over its codes. The weighted squared error
    sum h (s q + z - w)^2 expands into these sums."""

    def __init__(self, groups: np.ndarray, h: np.ndarray) -> None:
        self.groups, self.h = groups, h
        hw = h * groups
        self.sw = np.broadcast_to(h.sum(axis=-1), groups.shape[:-1])
        self.sx = hw.sum(axis=-1)
        self.sxx = (hw * groups).sum(axis=-1)

    def over(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sums that depend on the codes: of h q, h q^2 and h q w."""
        hq = self.h * codes
        return hq.sum(axis=-1), (hq * codes).sum(axis=-1), (hq * self.groups).sum(axis=-1)

    def error(self, code_sums, scale, zero) -> np.ndarray:
        sq, sqq, sqx = code_sums
        return (scale * scale * sqq + 2 * scale * zero * sq + zero * zero * self.sw
                - 2 * scale * sqx - 2 * zero * self.sx + self.sxx)

    def refit(self, code_sums, scale, zero, offset) -> tuple[np.ndarray, np.ndarray]:
        """The scale and zero minimizing the error for these codes (a 2x2 linear system per
        group), the zero rounded as it will be stored at ``offset`` + zero; groups whose system
        is (nearly) singular or gives no positive scale keep theirs."""
        sq, sqq, sqx = code_sums
        det = self.sw * sqq - sq * sq
        solvable = det > 1e-5 * self.sw * sqq  # well above float32's rounding
        safe_det = np.where(solvable, det, 1.0)
        new_scale = (self.sw * sqx - sq * self.sx) / safe_det
        new_zero = (sqq * self.sx - sq * sqx) / safe_det
        use = solvable & (new_scale > 0)
        return _stored_scale(np.where(use, new_scale, scale)), np.where(use, _stored(new_zero + offset) - offset, zero)


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
