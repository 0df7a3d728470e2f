"""int4 weights (SPEC §3, check 6): the canonical format, the torch kernels against a plain
numpy reference, and quality on real SmolLM2 weights."""
from __future__ import annotations

import numpy as np
import pytest

from qwen_serve import int4

# --- the canonical format ---------------------------------------------------------------------


def test_relative_error_on_standard_normal_weights():
    w = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    assert 0.08 <= int4.relative_error(w, int4.quantize(w)) <= 0.10


def test_packed_shapes_and_dtypes():
    q = int4.quantize(np.random.default_rng(1).standard_normal((3072, 1024)).astype(np.float32))
    assert q.packed.shape == (3072, 512) and q.packed.dtype == np.uint8
    assert q.scale.shape == (3072, 16) and q.scale.dtype == np.float16
    assert q.zero.shape == (3072, 16) and q.zero.dtype == np.float16
    assert q.shape == (3072, 1024)
    assert q.nbytes() == int4.nbytes(q) == 3072 * 512 + 2 * (3072 * 16 * 2)  # 1,769,472 B


def test_nibble_order_and_zero_convention_by_hand():
    # One group holding 0..15 four times: min 0, max 15 -> scale 1, zero 0, codes = the values.
    w = np.tile(np.arange(16, dtype=np.float32), 4)[None, :]
    q = int4.quantize(w)
    assert q.scale[0, 0] == 1.0 and q.zero[0, 0] == 0.0
    assert q.packed[0, :3].tolist() == [0x10, 0x32, 0x54]  # column 2j low nibble, 2j + 1 high
    shifted = int4.quantize(w * 0.5 - 3.0)  # scale 0.5, zero -3 (the value of code 0)
    assert shifted.scale[0, 0] == 0.5 and shifted.zero[0, 0] == -3.0
    assert np.array_equal(shifted.packed, q.packed)
    assert np.array_equal(int4.dequantize(shifted), w * 0.5 - 3.0)


def test_round_trip_error_is_at_most_half_a_step_per_group():
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 3.0, size=(64, 1))).astype(np.float32)
    w[3, 64:128] += 40.0  # a group far from zero
    q = int4.quantize(w)
    err = np.abs(int4.dequantize(q) - w).reshape(64, 4, 64).max(axis=-1)
    groups = w.reshape(64, 4, 64)
    step = (groups.max(-1) - groups.min(-1)) / 15
    slack = 2e-3 * np.abs(groups).max(-1)  # float16 rounding of scale and zero
    assert np.all(err <= step / 2 + slack)


def test_constant_groups_survive_exactly():
    w = np.full((2, 128), 0.75, dtype=np.float32)
    w[1, 64:] = 0.0
    assert np.array_equal(int4.dequantize(int4.quantize(w)), w)


def test_rejects_widths_that_are_not_whole_groups():
    assert not int4.can_quantize((8, 96))
    with pytest.raises(ValueError, match="multiple of 64"):
        int4.quantize(np.zeros((8, 96), dtype=np.float32))
