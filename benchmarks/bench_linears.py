"""The candidate matmuls of the torch backend on this CPU, side by side in one process: how the
kernels and layouts were chosen.

    python benchmarks/bench_linears.py

Four Qwen3-0.6B layers of distinct random weights (60M weights, so nothing stays in cache), at
1, 8, 16, 64 and 512 rows of x: the int4 kernels in each instruction-set variant this CPU runs
(AVX-512 with and without VNNI, AVX2; QWEN_SERVE_DISABLE_ISA takes some away), int4 prefill
tiles, and float32 / bfloat16 through F.linear and through oneDNN with a prepacked weight.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from qwen_serve.backends.torch_cpu import blocked_layout as blocked
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Scratch
from qwen_serve.backends.torch_cpu.native import Kernels, cpu_features, load_kernels
from qwen_serve.quant import int4

SHAPES = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072)] * 4
ROWS = (1, 8, 16, 64, 512)


def best_of(apply, weights, m: int, dtype=torch.float32, repeats: int = 3) -> float:
    xs = {k: torch.randn(m, k).to(dtype) for k in (1024, 2048, 3072)}
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for (_, k), w in zip(SHAPES, weights):
            apply(xs[k], w)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    print(f"threads {torch.get_num_threads()}, CPU features used: "
          f"{sorted(f for f in cpu_features() if f.startswith(('avx', 'amx', 'fma')))}")
    print(f"{'ms per 4 Qwen3-0.6B layers (60M weights)':44s}" + "".join(f"{f'M={m}':>10s}" for m in ROWS))

    def row(name: str, cells: list[float | None]) -> None:
        print(f"{name:44s}" + "".join(f"{'-':>10s}" if c is None else f"{c * 1e3:10.2f}" for c in cells), flush=True)

    quantized = [int4.quantize(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in SHAPES]
    native = load_kernels()
    variants = {}
    if native is not None and native.isa == "avx512":
        if native.vnni:
            variants["int4 kernel, AVX-512 VNNI"] = native
        variants["int4 kernel, AVX-512"] = Kernels("avx512", False, native.ops)
    if native is not None:
        variants["int4 kernel, AVX2"] = Kernels("avx2", False, native.ops)
    for name, kernels in variants.items():
        layers = [Int4Linear(q, kernels=kernels) for q in quantized]
        row(name, [best_of(lambda x, lin: lin._kernel_matmul(x), layers, m) for m in ROWS])
    for gemm in (torch.float32, torch.bfloat16):
        layers = [Int4Linear(q, kernels=native, scratch=Scratch(gemm_dtype=gemm, kernel_rows=0)) for q in quantized]
        row(f"int4 dequantized tiles + {str(gemm)[6:]} GEMM", [best_of(lambda x, lin: lin(x), layers, m) for m in ROWS])
    del quantized
    for dtype in (torch.float32, torch.bfloat16):
        weights = [(torch.randn(s) * 0.05).to(dtype) for s in SHAPES]
        row(f"{str(dtype)[6:]} F.linear", [best_of(F.linear, weights, m, dtype) for m in ROWS])
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        row(f"{str(dtype)[6:]} oneDNN prepacked", [best_of(
            lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), packed, m, dtype) for m in ROWS])
        del packed
        if dtype == torch.bfloat16 and native is not None and native.isa == "avx512" and "avx512_bf16" in cpu_features():
            pairs = [(blocked.block_pairs(w), w.shape[0]) for w in weights]
            row("bfloat16 blocked kernel (AVX512-BF16)", [best_of(
                lambda x, w: native.ops.bf16b_matmul_avx512(x, w[0], w[1]), pairs, m) for m in ROWS])


if __name__ == "__main__":
    main()
