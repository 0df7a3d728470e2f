"""Float linear layers: bfloat16 in the blocked layout of the bf16 kernel, or oneDNN's reordered
("prepacked") weight (on AVX2 CPUs, which multiply no bf16 natively, in the float32 kernel's layout,
widened in registers: torch's bf16 matmul took ~0.8 s per Qwen3.5-0.8B decode step on a Zen 3);
float32 in the blocked layout of the float32 kernel on AVX-512 and AVX2 CPUs, else through oneDNN
prepacked.

float32 takes its kernel for every row count, so a row's result depends on that row alone (batch
invariance: a request's logits the same alone or beside others; oneDNN took a matrix-vector path
at one row and other kernels from two on, which add up in other orders, and SmolLM2's
log-probabilities moved by up to 7e-5 between a request alone and in a batch of eight). It was
also the faster on a Zen 4 at every row count timed, 1 to 512 (1.4-2.3x at 1-16 rows, 1-6% at
512; the unpacked float32 head of 49152x576, 3.1 ms against F.linear's 10 at one row).

Which bf16 layout, and in the blocked one which path takes how many rows (the kernel, or tiles
unpacked for torch's GEMM in float32 or bf16), is the layer's PathPlan, timed on the CPU at hand
(kernel_choice.py). What the timings showed: on a Zen 4 without AMX the blocked kernel took float32
x to float32 y with no conversion around the call and beat prepacked oneDNN 1.5-1.7x at one row,
within 3% at 64-512 rows; on a Sapphire Rapids it still won at one row but oneDNN's AMX GEMM won
from 8 rows on, 3.5x at 512; on an Ice Lake, without AVX512-BF16, the kernel widens each weight
pair to float32 in registers and still beat float32 GEMM on unpacked tiles at every row class
(Qwen3-0.6B's 4096x1024 at 512 rows: 18.6 vs 20.6 ms; bf16 GEMM runs ~100x slower there). A layer
built outside a model, with no plan, takes the blocked kernel where it runs and the CPU has no
AMX, else oneDNN.

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
from .path_plan import ONEDNN, TILE_DTYPES, PathPlan
from .row_buckets import pad_rows
from .tiles import Scratch, tiled_matmul, transposed_tile


def compute_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if weight_dtype == torch.bfloat16 and has_fast_bf16_matmul() else torch.float32


def runs_f32_kernel(layer: "DenseLinear", kernels: Kernels | None) -> bool:
    """The float32 kernel (AVX-512, or AVX2 without it) for every row count: batch invariance."""
    return layer.weight.dtype == torch.float32 and kernels is not None and kernels.isa in ("avx512", "avx2")


def runs_bf16_kernel(layer: "DenseLinear", kernels: Kernels | None) -> bool:
    return layer.weight.dtype == torch.bfloat16 and kernels is not None and kernels.isa == "avx512" \
        and layer.in_features % 2 == 0


def runs_bf16_column_kernel(layer: "DenseLinear", kernels: Kernels | None) -> bool:
    """AVX2 without AVX-512: bf16 weights in the float32 kernel's column layout, widened in registers."""
    return layer.weight.dtype == torch.bfloat16 and kernels is not None and kernels.isa == "avx2"


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scratch: Scratch | None = None) -> None:
        self.weight: torch.Tensor | None = weight.contiguous()
        self.packed: torch.Tensor | None = None  # the oneDNN-ordered weight, once prepack() ran
        self.blocked: torch.Tensor | None = None  # bf16 rows for the kernel, once prepack() or as_head() blocked them
        self.kernels: Kernels | None = None
        self.bias = None if bias is None else bias.float()
        self.out_features, self.in_features = weight.shape
        self.dtype = compute_dtype(weight.dtype)
        self.scratch = scratch or Scratch()  # the blocked layout's prefill tiles
        self.plan: PathPlan | None = None  # a bf16 projection's timed paths (kernel_choice.py), before prepack()

    @classmethod
    def stacked(cls, parts: list["DenseLinear"]) -> "DenseLinear":
        """One layer computing every part's output side by side (merged_linear.py); before prepack()."""
        if any(part.weight is None for part in parts):
            raise ValueError("stack float layers before prepack() or as_head()")
        return cls(torch.cat([part.weight for part in parts]), stacked_bias(parts), parts[0].scratch)

    def prepack(self, kernels: Kernels | None = None) -> None:
        """float32 on AVX-512 or AVX2: the float32 kernel's layout, for every row count. bf16: the layout
        the plan names (without a plan: the blocked bf16 kernel's where ``kernels`` run it and
        there is no AMX, else oneDNN's; on AVX2 the columns), the plain weight dropped (so lookup() works
        only when blocked: not for a table an embedding shares). Leaves the layer as it was where
        neither runs."""
        if self.weight is None:
            return
        if runs_f32_kernel(self, kernels):
            self._block(kernels, blocked.block_columns)
            return
        wants_blocked = "amx_bf16" not in cpu_features() if self.plan is None else ONEDNN not in self.plan.paths
        if runs_bf16_column_kernel(self, kernels) and wants_blocked:
            self._block(kernels, blocked.block_columns)
            return
        if runs_bf16_kernel(self, kernels) and wants_blocked:
            self._block(kernels, blocked.block_pairs)
            return
        if self.weight.dtype != self.dtype or not torch.backends.mkldnn.is_available():
            return
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)
        except (RuntimeError, AttributeError):
            return
        self.weight = None

    def as_head(self, kernels: Kernels | None) -> None:
        """Float32 logits from here on: the bf16 or float32 kernel on its blocked layout where the
        CPU has it, else float32 compute."""
        if self.weight is None:
            return
        if runs_bf16_kernel(self, kernels):
            self._block(kernels, blocked.block_pairs)
        elif runs_f32_kernel(self, kernels) or runs_bf16_column_kernel(self, kernels):
            self._block(kernels, blocked.block_columns)
        else:
            self.dtype = torch.float32

    def streamed_tensors(self) -> tuple[str, ...]:
        """The attributes a matmul reads whole (huge_pages.py moves them; oneDNN's packed weight
        is opaque and stays)."""
        return ("weight", "blocked")

    def _block(self, kernels: Kernels, layout) -> None:
        self.blocked, self.kernels, self.weight = layout(self.weight), kernels, None

    @property
    def blocked_f32(self) -> bool:
        return self.blocked is not None and self.blocked.dtype == torch.float32

    @property
    def in_columns(self) -> bool:
        """Blocked as [blocks, K, 16 rows] (float32 anywhere, bf16 on AVX2), not in pairs."""
        return self.blocked is not None and self.blocked.dim() == 3

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.blocked is not None:  # float32 in and out, no conversion around the call
            x2 = x2.float().contiguous()
            path = "kernel" if self.plan is None else self.plan.path(x2.shape[0])
            if self.blocked_f32:  # every row count: batch invariance
                y = self.kernels.op("f32b_matmul")(x2, self.blocked, self.out_features)
            elif path == "kernel" and self.in_columns:
                y = self.kernels.ops.bf16c_matmul_avx2(x2, self.blocked, self.out_features)
            elif path == "kernel":
                y = self.kernels.ops.bf16b_matmul_avx512(x2, self.blocked, self.out_features, self.kernels.bf16)
            else:
                y = tiled_matmul(x2, self.out_features, self.scratch.rows_per_tile(self.in_features),
                                 TILE_DTYPES[path], self._tile)
        else:  # oneDNN: a bounded set of shapes (row_buckets.py)
            x2 = pad_rows(x2.to(self.dtype))
            if self.packed is not None:
                y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "")
            else:
                y = F.linear(x2, self.weight.to(self.dtype))
            y = y[: lead.numel()].float()
        y = y.view(*lead, self.out_features)
        return y if self.bias is None else y + self.bias

    def _tile(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return transposed_tile(self.scratch, self.in_features, start, stop, dtype, self._unpack)

    def _unpack(self, first: int, last: int, out: torch.Tensor) -> None:
        if self.in_columns:  # [K, blocks, 16] is the tile's order already
            out[:, :(last - first) * blocked.BLOCK].view(self.in_features, last - first, blocked.BLOCK).copy_(
                self.blocked[first:last].transpose(0, 1))
        else:
            self.kernels.ops.bf16b_unpack_avx512_(self.blocked, first, last, out)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the weight as float32 (an embedding lookup when this is a tied embedding)."""
        if self.in_columns:
            return blocked.column_rows(self.blocked, ids).float()
        if self.blocked is not None:
            return blocked.pair_rows(self.blocked, ids).float()
        return self.weight.index_select(0, ids).float()

    def with_rows(self, ids: torch.Tensor) -> "DenseLinear":
        """A layer computing only output rows ``ids`` (a head narrowed to part of the vocabulary),
        stored in this one's dtype, exactly its rows; laid out as a head (as_head) by the caller."""
        stored = next(t for t in (self.weight, self.blocked) if t is not None).dtype
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return DenseLinear(self.lookup(ids).to(stored), bias, self.scratch)

    def dequantize(self) -> torch.Tensor:
        if self.weight is None and self.packed is None:
            return self.lookup(torch.arange(self.out_features))
        return (self.weight if self.packed is None else self.packed.to_dense()).float()

    def nbytes(self) -> int:
        w = next(t for t in (self.weight, self.packed, self.blocked) if t is not None)
        return w.numel() * w.element_size()
