"""Attention on this CPU. Prefill: float32 against bfloat16, which dtype the prefill's
scaled_dot_product_attention should take here (issue 23 asked for bf16 where it is faster).
Decode (--decode): the paged decode kernel reading the KV cache in place, ms per layer by
context and batch.

    flock /work/cpu.lock python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --lengths 512,2048
    python benchmarks/bench_attention.py --decode --lengths 64,1024,4096,16384
    python benchmarks/bench_attention.py --decode --compare-pages   # KV pools in 2 MiB against 4 KiB pages

Prefill: Qwen3-0.6B's geometry (16 query heads on 8 KV heads of 128), one causal prompt per
length, as CachedAttention calls it (grouped-query attention without expanding K and V), best of
5. The bfloat16 time includes rounding q, k and v to bf16 and the output back to float32, as a
bf16 prefill path would pay them.

Decode: Qwen3.5's attention layers (8 query heads on 2 KV heads of 256) and Qwen3-0.6B's, float32
and bfloat16 caches, each sequence's blocks shuffled over the pool as a long-running server leaves
them; the step cycles through enough layers (at least 64 MiB of KV) that the reads come from
memory, not from the last level cache, as in a model's decode step. Best of 5 passes. The pools lie
in 2 MiB pages as the server keeps them; --compare-pages measures each case in 2 MiB and in 4 KiB
pages in turns (default lengths 4096,16384).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from qwen_serve.backends.torch_cpu.kv_storage import TorchKVStorage
from qwen_serve.backends.torch_cpu.native import load_kernels
from qwen_serve.backends.torch_cpu.paged_decode import PagedDecode
from qwen_serve.bench.machine import machine_header

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
REPEATS = 5


def best_ms(run) -> float:
    run()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True,
                                         scale=HEAD_DIM ** -0.5, enable_gqa=True)
    return out.float()


DECODE_GEOMETRIES = {"qwen3.5": (8, 2, 256), "qwen3-0.6b": (16, 8, 128)}
DECODE_BATCHES = (1, 8)
FROM_MEMORY_BYTES = 64 << 20
BLOCK = 16


def decode_ms(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, length: int, batch: int,
              huge_pages: bool = True) -> float:
    """ms per layer of paged decode attention for `batch` sequences of `length` tokens, the KV pools in
    2 MiB pages as the server keeps them (huge_pages) or in 4 KiB pages."""
    blocks_each = -(-length // BLOCK)
    blocks = blocks_each * batch
    layer_bytes = 2 * blocks * BLOCK * kv_heads * head_dim * dtype.itemsize
    layers = max(2, -(-FROM_MEMORY_BYTES // layer_bytes))
    storage = TorchKVStorage(layers, kv_heads, head_dim, dtype, BLOCK, blocks, blocks, huge_pages=huge_pages)
    storage.ensure_blocks(blocks)
    for layer in range(layers):
        storage.keys[layer].normal_()
        storage.values[layer].normal_()
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(0))
    tables = order.view(batch, blocks_each)
    paged = PagedDecode(storage, tables.contiguous(), torch.full((batch,), length), load_kernels())
    q = torch.randn(batch, heads, head_dim)

    def step() -> None:
        for layer in range(layers):
            paged.attend(layer, q, head_dim ** -0.5)

    return best_ms(step) / layers


def compare_pages(lengths: list[int], turns: int = 3) -> None:
    """Each case with the KV pools in 2 MiB pages and in 4 KiB pages, one after the other, `turns`
    times: ms a layer of each turn, and the ratio of their medians."""
    print(f"{'geometry':>11s} {'cache':>9s} {'batch':>6s} {'context':>8s}  {'2 MiB pages, ms/layer':>24s}  "
          f"{'4 KiB pages':>24s}  {'2 MiB / 4 KiB':>13s}")
    for name, (heads, kv_heads, head_dim) in DECODE_GEOMETRIES.items():
        for dtype in (torch.bfloat16, torch.float32):
            for batch in DECODE_BATCHES:
                for n in lengths:
                    huge, small = [], []
                    for _ in range(turns):
                        huge.append(decode_ms(heads, kv_heads, head_dim, dtype, n, batch, huge_pages=True))
                        small.append(decode_ms(heads, kv_heads, head_dim, dtype, n, batch, huge_pages=False))
                    cells = [" ".join(f"{ms:7.3f}" for ms in times) for times in (huge, small)]
                    ratio = statistics.median(huge) / statistics.median(small)
                    print(f"{name:>11s} {str(dtype)[6:]:>9s} {batch:6d} {n:8d}  {cells[0]:>24s}  {cells[1]:>24s}  "
                          f"{ratio:13.3f}", flush=True)


def lengths(given: str | None, default: str) -> list[int]:
    return [int(x) for x in (given or default).split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default=None, help="prompt or context lengths (default 72,512,2048; "
                                                        "with --decode 64,1024,4096,16384)")
    parser.add_argument("--decode", action="store_true", help="the paged decode kernel instead of prefill")
    parser.add_argument("--compare-pages", action="store_true",
                        help="with --decode: the KV pools in 2 MiB pages against 4 KiB, in turns")
    args = parser.parse_args()
    print(machine_header(), f"\ntorch {torch.get_num_threads()} threads")
    if args.decode and args.compare_pages:
        compare_pages(lengths(args.lengths, "4096,16384"))
        return
    if args.decode:
        print(f"{'geometry':>11s} {'cache':>9s} {'batch':>6s} {'context':>8s} {'ms/layer':>9s} {'GB/s':>6s}")
        for name, (heads, kv_heads, head_dim) in DECODE_GEOMETRIES.items():
            for dtype in (torch.bfloat16, torch.float32):
                for batch in DECODE_BATCHES:
                    for n in lengths(args.lengths, "64,1024,4096,16384"):
                        ms = decode_ms(heads, kv_heads, head_dim, dtype, n, batch)
                        read = 2 * batch * n * kv_heads * head_dim * dtype.itemsize
                        print(f"{name:>11s} {str(dtype)[6:]:>9s} {batch:6d} {n:8d} {ms:9.3f} {read / ms / 1e6:6.1f}",
                              flush=True)
        return
    print(f"{'prompt':>8s} {'float32 ms':>12s} {'bfloat16 ms':>12s} {'bf16 / f32':>11s}")
    for n in lengths(args.lengths, "72,512,2048"):
        q, k, v = torch.randn(1, HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM)
        f32 = best_ms(lambda: attend(q, k, v, torch.float32))
        bf16 = best_ms(lambda: attend(q, k, v, torch.bfloat16))
        print(f"{n:8d} {f32:12.2f} {bf16:12.2f} {bf16 / f32:10.2f}x")


if __name__ == "__main__":
    main()
