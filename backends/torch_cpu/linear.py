"""Float linear layers: bfloat16 through the blocked bf16 kernel where the CPU has AVX-512 (and no
AMX), otherwise through oneDNN with the weight reordered once at load ("prepacked").

Prepacked, torch's oneDNN linear ran 2x faster than ``F.linear`` on the same weights for float32
at every batch size on a Zen 5 and 1.6x for bfloat16 at decode sizes (``python
benchmarks/bench_linears.py``). bfloat16 weights are multiplied in bfloat16 (float32
accumulation) where the CPU does that natively (AVX512-BF16 or AMX); elsewhere bf16 matmul runs
~100x slower than float32, so there they are upcast per call and bf16 only saves memory.
On a Zen 4 EPYC without AMX the blocked kernel (kernels/bf16_avx512.cpp) took float32 x and
gave float32 y with no conversion around the call, and beat prepacked oneDNN at 1-16 rows
(1.5-1.7x at one row, 4 Qwen3-0.6B layers) and came within 3% of it at 64-512, so there it takes
every call; AMX CPUs, whose bf16 GEMM is several times faster at prefill, keep oneDNN. On AVX-512
CPUs without AVX512-BF16 (an Ice Lake) the same kernel widens the weight pairs to float32 in
registers; the alternative there was converting the whole weight to float32 on every call.
Outputs are float32 either way: the residual stream, norms and softmax stay float32. The layer
that gives logits (as_head) multiplies with float32 results: rounded to bf16, SmolLM2's two most
likely first tokens for "What is the capital of France?" tied and argmax took the wrong one. There a
bf16 weight goes to the blocked layout of the kernel on any AVX-512 CPU; it also reads the
embedding rows of a tied table.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import blocked_layout as blocked
from .merged_linear import stacked_bias
from .native import Kernels, cpu_features, has_fast_bf16_matmul
from .row_buckets import pad_rows


def compute_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if weight_dtype == torch.bfloat16 and has_fast_bf16_matmul() else torch.float32


def runs_bf16_kernel(layer: "DenseLinear", kernels: Kernels | None) -> bool:
    return layer.weight.dtype == torch.bfloat16 and kernels is not None and kernels.isa == "avx512" \
        and layer.in_features % 2 == 0


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight: torch.Tensor | None = weight.contiguous()
        self.packed: torch.Tensor | None = None  # the oneDNN-ordered weight, once prepack() ran
        self.blocked: torch.Tensor | None = None  # bf16 rows for the kernel, once prepack() or as_head() blocked them
        self.kernels: Kernels | None = None
        self.bias = None if bias is None else bias.float()
        self.out_features, self.in_features = weight.shape
        self.dtype = compute_dtype(weight.dtype)

    @classmethod
    def stacked(cls, parts: list["DenseLinear"]) -> "DenseLinear":
        """One layer computing every part's output side by side (merged_linear.py); before prepack()."""
        if any(part.weight is None for part in parts):
            raise ValueError("stack float layers before prepack() or as_head()")
        return cls(torch.cat([part.weight for part in parts]), stacked_bias(parts))

    def prepack(self, kernels: Kernels | None = None) -> None:
        """The layout this CPU multiplies fastest (the blocked bf16 kernel where ``kernels`` run it
        and there is no AMX, else oneDNN's), the plain weight dropped (so lookup() works only when
        blocked: not for a table an embedding shares). Leaves the layer as it was where neither runs."""
        if self.weight is None:
            return
        if runs_bf16_kernel(self, kernels) and "amx_bf16" not in cpu_features():
            self._block(kernels)
            return
        if self.weight.dtype != self.dtype or not torch.backends.mkldnn.is_available():
            return
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)
        except (RuntimeError, AttributeError):
            return
        self.weight = None

    def as_head(self, kernels: Kernels | None) -> None:
        """Float32 logits from here on: the bf16 kernel on the blocked layout where the CPU has
        it, else float32 compute."""
        if self.weight is None:
            return
        if runs_bf16_kernel(self, kernels):
            self._block(kernels)
        else:
            self.dtype = torch.float32

    def streamed_tensors(self) -> tuple[str, ...]:
        """The attributes a matmul reads whole (huge_pages.py moves them; oneDNN's packed weight
        is opaque and stays)."""
        return ("weight", "blocked")

    def _block(self, kernels: Kernels) -> None:
        self.blocked, self.kernels, self.weight = blocked.block_pairs(self.weight), kernels, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.blocked is not None:  # float32 in and out, no conversion around the call
            y = self.kernels.ops.bf16b_matmul_avx512(x2.float().contiguous(), self.blocked, self.out_features,
                                                     self.kernels.bf16)
        else:  # oneDNN: a bounded set of shapes (row_buckets.py)
            x2 = pad_rows(x2.to(self.dtype))
            if self.packed is not None:
                y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "")
            else:
                y = F.linear(x2, self.weight.to(self.dtype))
            y = y[: lead.numel()].float()
        y = y.view(*lead, self.out_features)
        return y if self.bias is None else y + self.bias

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight as float32 (an embedding lookup when this is a tied embedding)."""
        if self.blocked is not None:
            return blocked.pair_rows(self.blocked, ids).float()
        return self.weight.index_select(0, ids).float()

    def dequantize(self) -> torch.Tensor:
        if self.weight is None and self.packed is None:
            return self.lookup(torch.arange(self.out_features))
        return (self.weight if self.packed is None else self.packed.to_dense()).float()

    def nbytes(self) -> int:
        w = next(t for t in (self.weight, self.packed, self.blocked) if t is not None)
        return w.numel() * w.element_size()
