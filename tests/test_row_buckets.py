"""oneDNN sees a bounded set of row counts (its shape caches would otherwise grow with every new
prompt length), and padding rows changes no result."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear
from qwen_serve.backends.torch_cpu.linear import DenseLinear
from qwen_serve.backends.torch_cpu.path_plan import PathPlan
from qwen_serve.backends.torch_cpu.row_buckets import EXACT_ROWS, bucket_rows
from qwen_serve.backends.torch_cpu.tiles import Scratch
from qwen_serve.quant import int4


def test_decode_sizes_stay_exact_and_longer_ones_share_a_few_shapes():
    assert [bucket_rows(n) for n in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))
    buckets = {bucket_rows(n) for n in range(1, 513)}
    assert len(buckets) == EXACT_ROWS + 23
    for n in range(1, 4097):
        assert n <= bucket_rows(n) <= n + max(15, n // 8)
        assert bucket_rows(bucket_rows(n)) == bucket_rows(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 17, 33, 130, 300])
def test_padded_rows_change_no_output(dtype, rows):
    torch.manual_seed(rows)
    weight = (torch.randn(96, 64) * 0.1).to(dtype)
    x = torch.randn(rows, 64)
    dense = DenseLinear(weight)
    dense.prepack()
    expected = F.linear(x.to(dense.dtype), weight.to(dense.dtype)).float()
    assert dense(x).shape == (rows, 96)
    torch.testing.assert_close(dense(x), expected, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)
    tiled = Int4Linear(int4.quantize(weight.float().numpy()), scratch=Scratch())
    tiled.plan = PathPlan.fixed("tiles_bf16" if dtype == torch.bfloat16 else "tiles_f32")
    reference = F.linear(x, tiled.dequantize())
    torch.testing.assert_close(tiled(x), reference, rtol=2e-2, atol=2e-2)
    assert tiled(x.view(1, rows, 64)).shape == (1, rows, 96)
