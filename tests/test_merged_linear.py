"""Merged projections (q/k/v, gate/up): one stacked layer gives what its parts give apart."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qwen_serve.backends.torch_cpu import blocked_layout as blocked
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear
from qwen_serve.backends.torch_cpu.linear import DenseLinear
from qwen_serve.backends.torch_cpu.merged_linear import MergedLinear
from qwen_serve.backends.torch_cpu.native import Kernels, load_kernels
from qwen_serve.backends.torch_cpu.path_plan import PathPlan
from qwen_serve.backends.torch_cpu.tiles import Scratch
from qwen_serve.quant import int4

KERNELS = load_kernels()
# Each way an int4 layer is stored: blocked (AVX-512), canonical read by AVX2 kernels, no kernels.
INT4_KERNELS = {"none": None}
if KERNELS is not None:
    INT4_KERNELS[KERNELS.isa] = KERNELS
    if KERNELS.isa == "avx512":
        INT4_KERNELS["avx2"] = Kernels("avx2", False, KERNELS.ops)

SIZES = (40, 24, 16)  # 40 and 24: parts whose blocked layout pads the last block of 16 rows


def _weights(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 128)).astype(np.float32) for n in SIZES]


@pytest.mark.parametrize("kernels", INT4_KERNELS)
@pytest.mark.parametrize("rows", [1, 5, 80])
def test_merged_int4_layer_gives_each_parts_output(kernels, rows):
    kind = INT4_KERNELS[kernels]
    scratch = Scratch()
    parts = [Int4Linear(int4.quantize(w), scratch=scratch, kernels=kind) for w in _weights(rows)]
    for part in parts:
        part.plan = PathPlan(("kernel",) * 3 + ("tiles_f32",) * 3)  # 80 rows: the dequantized-tile path
    merged = MergedLinear(("q", "k", "v"), parts)
    assert isinstance(merged.linear, Int4Linear) and merged.linear.out_features == sum(SIZES)
    x = torch.randn(rows, 128)
    for got, part in zip(merged(x), parts):
        torch.testing.assert_close(got, part(x), rtol=1e-5, atol=1e-5)
    # the same codes, not a new quantization
    torch.testing.assert_close(merged.linear.dequantize(), torch.cat([p.dequantize() for p in parts]), rtol=0, atol=0)


def test_unblocking_gives_back_the_canonical_int4_weight():
    q = int4.quantize(np.random.default_rng(3).standard_normal((40, 192)).astype(np.float32))
    back = blocked.unblock_int4(*blocked.block_int4(q), rows=40)
    for field in ("packed", "scale", "zero"):
        assert np.array_equal(getattr(back, field), getattr(q, field))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_float_layer_gives_each_parts_output_with_its_bias(dtype):
    weights = [torch.from_numpy(w).to(dtype) for w in _weights(0)]
    biases = [torch.randn(SIZES[0]), None, torch.randn(SIZES[2])]  # a part without a bias adds nothing
    parts = [DenseLinear(w, b) for w, b in zip(weights, biases)]
    merged = MergedLinear(("q", "k", "v"), parts)
    merged.linear.prepack()
    x = torch.randn(3, 128)
    for got, part in zip(merged(x), parts):
        torch.testing.assert_close(got, part(x), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-3)


def test_parts_of_different_kinds_are_refused():
    w = _weights(1)
    with pytest.raises(TypeError, match="cannot merge"):
        MergedLinear(("gate", "up"), [DenseLinear(torch.from_numpy(w[0])), Int4Linear(int4.quantize(w[1]))])
