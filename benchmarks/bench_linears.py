"""The candidate matmuls of the torch backend on this CPU, side by side in one process: how the
kernels and layouts were chosen.

    python benchmarks/bench_linears.py
    python benchmarks/bench_linears.py --merged   # q/k/v and gate/up apart against merged

Four Qwen3-0.6B layers of distinct random weights (60M weights, so nothing stays in cache), at
1, 8, 16, 64 and 512 rows of x: the int4 kernels in each instruction-set variant this CPU runs
(AVX-512 with and without VNNI, AVX2; QWEN_SERVE_DISABLE_ISA takes some away), int4 prefill
tiles, and float32 / bfloat16 through F.linear and through oneDNN with a prepacked weight.
With --merged: random-weight layers of the model's own classes (int4, bfloat16), q/k/v and gate/up as separate
projections against merged into one matmul each (merged_linear.py), measured in turns.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from qwen_serve.backends.torch_cpu import blocked_layout as blocked
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear
from qwen_serve.backends.torch_cpu.linear import DenseLinear
from qwen_serve.backends.torch_cpu.merged_linear import MergedLinear
from qwen_serve.backends.torch_cpu.native import Kernels, cpu_features, load_kernels
from qwen_serve.backends.torch_cpu.path_plan import TILE_DTYPES, PathPlan
from qwen_serve.backends.torch_cpu.tiles import Scratch
from qwen_serve.bench.machine import machine_header
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merged", action="store_true", help="only q/k/v and gate/up apart against merged")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    print(machine_header())
    print(f"threads {torch.get_num_threads()}, CPU features the kernels may use: "
          f"{sorted(f for f in cpu_features() if f.startswith(('avx', 'amx', 'fma')))}")
    if args.merged:
        return compare_merged(rng)
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
    for path in ("tiles_f32", "tiles_bf16"):
        layers = [Int4Linear(q, kernels=native, scratch=Scratch()) for q in quantized]
        for layer in layers:
            layer.plan = PathPlan.fixed(path)
        row(f"int4 dequantized tiles + {TILE_DTYPES[path]} GEMM"[:44], [best_of(lambda x, lin: lin(x), layers, m) for m in ROWS])
    del quantized
    for dtype in (torch.float32, torch.bfloat16):
        weights = [(torch.randn(s) * 0.05).to(dtype) for s in SHAPES]
        row(f"{str(dtype)[6:]} F.linear", [best_of(F.linear, weights, m, dtype) for m in ROWS])
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        row(f"{str(dtype)[6:]} oneDNN prepacked", [best_of(
            lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), packed, m, dtype) for m in ROWS])
        del packed
        if dtype == torch.bfloat16 and native is not None and native.isa == "avx512":
            pairs = [(blocked.block_pairs(w), w.shape[0]) for w in weights]
            for dot in sorted({native.bf16, False}, reverse=True):
                row(f"bfloat16 blocked kernel ({'AVX512-BF16' if dot else 'widened to float32'})", [best_of(
                    lambda x, w: native.ops.bf16b_matmul_avx512(x, w[0], w[1], dot), pairs, m) for m in ROWS])


MERGED_ROWS = (1, 8, 16, 64)


def compare_merged(rng: np.random.Generator, layers: int = 4, turns: int = 5) -> None:
    """Per layer: 7 calls (q, k, v, o, gate, up, down) against 4 (qkv, o, gate_up, down), on the
    same weights; best of ``turns`` alternating runs of each."""
    groups = [(0, 1, 2), (3,), (4, 5), (6,)]  # indices into one layer's 7 SHAPES
    for kind in ("int4", "bfloat16"):
        def make(w: np.ndarray):
            if kind == "int4":
                return Int4Linear(int4.quantize(w))
            return DenseLinear(torch.from_numpy(w).bfloat16())

        apart, merged = [], []
        for _ in range(layers):
            weights = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in SHAPES[:7]]
            parts = [make(w) for w in weights]
            merged += [MergedLinear([str(i) for i in g], [parts[i] for i in g]) if len(g) > 1 else parts[g[0]]
                       for g in groups]
            apart += parts
        for linear in apart + [getattr(m, "linear", m) for m in merged]:
            if isinstance(linear, DenseLinear):
                linear.prepack()
        xs = {k: torch.randn(max(MERGED_ROWS), k) for k in (1024, 2048, 3072)}

        def run(linears, m: int) -> float:
            t = time.perf_counter()
            for linear in linears:
                linear(xs[getattr(linear, "linear", linear).in_features][:m])
            return time.perf_counter() - t

        print(f"{kind}, ms per {layers} layers" + "".join(f"{f'M={m}':>16s}" for m in MERGED_ROWS))
        cells = []
        for m in MERGED_ROWS:
            best = {"apart": float("inf"), "merged": float("inf")}
            for _ in range(turns):
                best["apart"] = min(best["apart"], run(apart, m))
                best["merged"] = min(best["merged"], run(merged, m))
            cells.append(best)
        for name in ("apart", "merged"):
            print(f"  {name:22s}" + "".join(f"{c[name] * 1e3:16.2f}" for c in cells))
        print(f"  {'apart / merged':22s}" + "".join(f"{c['apart'] / c['merged']:15.2f}x" for c in cells), flush=True)


if __name__ == "__main__":
    main()
