"""Quantized linear layers: int4 (the canonical format), and int6 or int8 rows (the tied
embedding / lm_head).

Decode (a few rows of x) runs the C++ kernels of native.py, which read the packed weights once
per call however many rows x has. On AVX-512 CPUs the weights are reordered at load into the
blocked layouts of blocked_layout.py (16 output rows per register, same bytes); on AVX2 CPUs
the kernels read the canonical layout in place. Prefill (many rows) may be compute-bound instead:
a tile of the weight is dequantized into a reused scratch buffer and multiplied by torch's GEMM
in float32 or bfloat16 (whose rounding is far below int4's own error), so the unpacking is paid
once per tile for all the rows. Which path takes how many rows is the layer's PathPlan, chosen by
timing both on the CPU at hand (kernel_choice.py). Without the kernels the tiles take every call
(slow but correct).
"""
from __future__ import annotations

import torch

from qwen_serve.quant import int4
from qwen_serve.quant.int4 import GROUP, Int4Weight, can_quantize

from . import blocked_layout as blocked
from .merged_linear import stacked_bias
from .native import Kernels, load_kernels
from .path_plan import TILE_DTYPES, PathPlan
from .tiles import Scratch, tiled_matmul, transposed_tile

ROWS_PER_PASS = 8192  # rows quantized at a time, so a 151936-row embedding needs no full float copy


class _QuantizedLinear:
    """y = x @ W.T + b: the small-batch kernel when there is one, else dequantized tiles + BLAS.

    A subclass sets kind, out_features, in_features, bias, scratch and kernels, and provides
    _kernel_matmul(x), _fill_tile(start, stop, out) and lookup(ids), plus _prepare_tiled(x) when its tiles
    hold the columns in another order than x, or _tile(start, stop, dtype) when it can write a
    tile in the GEMM's dtype itself. ``plan`` says which path takes how many rows: by default the
    kernel every time (tiles where there is none) until a model sets the measured one.
    """

    kind: str  # the format's name, as kernel_choice and QWEN_SERVE_KERNELS say it
    out_features: int
    in_features: int
    bias: torch.Tensor | None
    scratch: Scratch
    kernels: Kernels | None
    plan: PathPlan

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        path = self.plan.path(x2.shape[0])
        if path == "kernel" and self.kernels is not None:
            y = self._kernel_matmul(x2)
        else:
            y = self._tiled_matmul(self._prepare_tiled(x2), TILE_DTYPES.get(path, torch.float32))
        if self.bias is not None:
            y += self.bias
        return y.view(*lead, self.out_features)

    def with_rows(self, ids: torch.Tensor) -> "_QuantizedLinear":
        """A layer of this format computing only output rows ``ids`` (a head narrowed to part of
        the vocabulary): the rows dequantized and quantized again, which gives back their codes
        and scales (a group's largest code is its full scale again) up to float rounding."""
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return type(self)(self.lookup(ids), bias, scratch=self.scratch, kernels=self.kernels)

    def _default_plan(self) -> PathPlan:
        return PathPlan.fixed("kernel" if self.kernels is not None else "tiles_f32")

    def _prepare_tiled(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def dequantize(self) -> torch.Tensor:
        """W as float32 [out_features, in_features], through the subclass's lookup(ids)."""
        return self.lookup(torch.arange(self.out_features))

    def _tiled_matmul(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """y = x @ W.T with W dequantized one tile of rows at a time into the shared scratch."""
        return tiled_matmul(x, self.out_features, self.scratch.rows_per_tile(self.in_features), dtype, self._tile)

    def _tile(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [start, stop) of W dequantized [stop - start, K] in dtype (a view of the scratch)."""
        tile = self.scratch.tile(stop - start, self.in_features)
        self._fill_tile(start, stop, tile)
        if dtype != torch.float32:
            tile = self.scratch.tile(stop - start, self.in_features, dtype).copy_(tile)
        return tile


class Int4Linear(_QuantizedLinear):
    """W in the canonical int4 format, reordered into the blocked layout where the AVX-512
    kernels run and read in place elsewhere. ``kernels`` defaults to this machine's."""

    kind = "int4"

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None, scratch: Scratch | None = None,
                 kernels: Kernels | None | str = "auto") -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.float()
        self.scratch = scratch or Scratch()
        self.kernels = load_kernels() if kernels == "auto" else kernels
        self.plan = self._default_plan()
        self.blocked = self.kernels is not None and self.kernels.isa == "avx512"
        if self.blocked:
            self.codes, self.scale, self.zero = blocked.block_int4(weight)
        else:  # shares memory with the canonical arrays
            self.codes = torch.from_numpy(weight.packed)
            self.scale, self.zero = torch.from_numpy(weight.scale), torch.from_numpy(weight.zero)

    @classmethod
    def stacked(cls, parts: list["Int4Linear"]) -> "Int4Linear":
        """One layer computing every part's output side by side (merged_linear.py): the same codes."""
        merged = int4.concatenate([part.canonical() for part in parts])
        stacked = cls(merged, stacked_bias(parts), scratch=parts[0].scratch, kernels=parts[0].kernels)
        stacked.plan = parts[0].plan
        return stacked

    def streamed_tensors(self) -> tuple[str, ...]:
        """The attributes a matmul reads whole (huge_pages.py moves them)."""
        return ("codes", "scale", "zero")

    def with_rows(self, ids: torch.Tensor) -> "Int4Linear":
        """_QuantizedLinear.with_rows: the canonical rows as they are (no quantizing again)."""
        canonical = self.canonical()
        rows = ids.numpy()
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return Int4Linear(Int4Weight(canonical.packed[rows], canonical.scale[rows], canonical.zero[rows]), bias,
                          scratch=self.scratch, kernels=self.kernels)

    def canonical(self) -> Int4Weight:
        if self.blocked:
            return blocked.unblock_int4(self.codes, self.scale, self.zero, self.out_features)
        return Int4Weight(self.codes.numpy(), self.scale.numpy(), self.zero.numpy())

    def _kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked:
            return self.kernels.ops.q4b_matmul_avx512(x, self.codes, self.scale, self.zero, self.out_features,
                                                      self.kernels.vnni)
        return self.kernels.ops.q4_matmul_avx2(x, self.codes, self.scale, self.zero)

    def _prepare_tiled(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is None or self.blocked:
            return x
        return self.kernels.ops.permute_groups(x)  # the AVX2 tiles order each group evens, then odds

    def _tile(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Blocked: the kernel writes the tile transposed, [K, rows], in dtype itself; GEMM takes
        it as is (the transpose is a view)."""
        if not self.blocked or self.kernels is None:
            return super()._tile(start, stop, dtype)
        return transposed_tile(self.scratch, self.in_features, start, stop, dtype, self._unpack)

    def _unpack(self, first: int, last: int, out: torch.Tensor) -> None:
        self.kernels.ops.q4b_unpack_avx512_(self.codes, self.scale, self.zero, first, last, out)

    def _fill_tile(self, start: int, stop: int, out: torch.Tensor) -> None:
        if self.blocked:
            first, last = start // blocked.BLOCK, -(-stop // blocked.BLOCK)
            whole = out if (last - first) * blocked.BLOCK == stop - start else \
                torch.empty((last - first) * blocked.BLOCK, self.in_features)
            blocked.int4_block_rows(self.codes, self.scale, self.zero, first, last, whole)
            if whole is not out:
                out.copy_(whole[: stop - start])
        elif self.kernels is not None:
            self.kernels.ops.q4_dequant_split_avx2(self.codes[start:stop], self.scale[start:stop],
                                                   self.zero[start:stop], out)
        else:
            out.copy_(self.lookup(torch.arange(start, stop)))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows (an embedding lookup when this weight is a tied embedding)."""
        if self.blocked:
            return blocked.int4_rows(self.codes, self.scale, self.zero, ids)
        packed = self.codes.index_select(0, ids)
        codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # low nibble first
        scale = self.scale.index_select(0, ids).float()
        zero = self.zero.index_select(0, ids).float()
        groups = codes.view(len(ids), -1, GROUP).float()
        return (groups * scale[..., None] + zero[..., None]).view(len(ids), self.in_features)

    def nbytes(self) -> int:
        stored = self.codes.numel() + 2 * (self.scale.numel() + self.zero.numel())  # blocked: with padding rows
        return stored + (0 if self.bias is None else self.bias.numel() * 4)


class Int8Linear(_QuantizedLinear):
    """W as int8 rows with one float32 scale per row (symmetric), quantized from a float weight;
    blocked for the AVX-512 kernels."""

    kind = "int8"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scratch: Scratch | None = None,
                 kernels: Kernels | None | str = "auto") -> None:
        self.out_features, self.in_features = weight.shape
        codes = torch.empty(weight.shape, dtype=torch.int8)
        scale = torch.empty(self.out_features, dtype=torch.float32)
        for start in range(0, self.out_features, ROWS_PER_PASS):  # bounded float temporaries
            w = weight[start:start + ROWS_PER_PASS].float()
            amax = w.abs().amax(dim=1)
            step = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
            scale[start:start + ROWS_PER_PASS] = step
            codes[start:start + ROWS_PER_PASS] = torch.round(w / step[:, None]).clamp_(-127, 127)
        self.bias = None if bias is None else bias.float()
        self.scratch = scratch or Scratch()
        self.kernels = (load_kernels() if kernels == "auto" else kernels) if self.in_features % GROUP == 0 else None
        self.plan = self._default_plan()
        self.blocked = self.kernels is not None and self.kernels.isa == "avx512"
        self.codes, self.scale = blocked.block_int8(codes, scale) if self.blocked else (codes, scale)

    def streamed_tensors(self) -> tuple[str, ...]:
        return ("codes", "scale")

    def _kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocked:
            return self.kernels.ops.q8b_matmul_avx512(x, self.codes, self.scale, self.out_features, self.kernels.vnni)
        return self.kernels.ops.q8_matmul_avx2(x, self.codes, self.scale)

    def _fill_tile(self, start: int, stop: int, out: torch.Tensor) -> None:
        if self.blocked:
            out.copy_(self.lookup(torch.arange(start, stop)))
        else:
            torch.mul(self.codes[start:stop], self.scale[start:stop, None], out=out)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.blocked:
            return blocked.int8_rows(self.codes, self.scale, ids)
        return self.codes.index_select(0, ids).float() * self.scale.index_select(0, ids)[:, None]

    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scale.numel() + (0 if self.bias is None else self.bias.numel() * 4)


class Int6Linear(_QuantizedLinear):
    """W as 6-bit codes with a float16 scale per row and group of 64 inputs (symmetric), quantized
    from a float weight, in the blocked layout of the VNNI kernel: the tied embedding / lm_head
    where that kernel runs. 6.25 bits a weight against int8 rows' 8 (the class of llama.cpp's Q6_K
    output layer): on Qwen3.5-2B the head, 40% of a decoded token's bytes at int8, drops from 510
    to 397 MB. Without the kernel (forced off, or a plan's tiles) the rows are dequantized with
    torch ops: correct, slow."""

    kind = "int6"

    LEVELS = 31  # codes -31..31 (the layout holds -32..31)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scratch: Scratch | None = None,
                 kernels: Kernels | None | str = "auto") -> None:
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP:
            raise ValueError(f"int6 rows need an input width that is a multiple of {GROUP}; got {self.in_features}")
        groups = self.in_features // GROUP
        blocks = -(-self.out_features // blocked.BLOCK)
        self.codes = torch.empty(blocks, groups, blocked.INT6_GROUP_BYTES, dtype=torch.uint8)
        self.scale = torch.empty(blocks, groups, blocked.BLOCK, dtype=torch.float16)
        for start in range(0, self.out_features, ROWS_PER_PASS):  # bounded float temporaries; a multiple of 16
            w = weight[start:start + ROWS_PER_PASS].float().view(-1, groups, GROUP)
            step = (w.abs().amax(dim=2) / self.LEVELS).half()
            safe = torch.where(step > 0, step.float(), torch.ones_like(step, dtype=torch.float32))
            codes = torch.round(w / safe[..., None]).clamp_(-self.LEVELS, self.LEVELS).to(torch.int8)
            part = slice(start // blocked.BLOCK, -(-(start + len(w)) // blocked.BLOCK))
            self.codes[part], self.scale[part] = blocked.block_int6(codes.view(len(w), -1), step)
        self.bias = None if bias is None else bias.float()
        self.scratch = scratch or Scratch()
        loaded = load_kernels() if kernels == "auto" else kernels
        self.kernels = loaded if loaded is not None and loaded.vnni8 else None
        self.plan = self._default_plan()

    def streamed_tensors(self) -> tuple[str, ...]:
        return ("codes", "scale")

    def _kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.ops.q6b_matmul_vnni8(x, self.codes, self.scale, self.out_features)

    def _fill_tile(self, start: int, stop: int, out: torch.Tensor) -> None:
        out.copy_(self.lookup(torch.arange(start, stop)))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return blocked.int6_rows(self.codes, self.scale, ids)

    def nbytes(self) -> int:
        return self.codes.numel() + 2 * self.scale.numel() + (0 if self.bias is None else self.bias.numel() * 4)


def quantizable(weight: torch.Tensor) -> bool:
    return can_quantize(tuple(weight.shape))
