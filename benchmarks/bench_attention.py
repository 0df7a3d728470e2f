"""Prefill attention on this CPU, float32 against bfloat16: which dtype the prefill's
scaled_dot_product_attention should take here (issue 23 asked for bf16 where it is faster).

    flock /work/cpu.lock python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --lengths 512,2048

Qwen3-0.6B's geometry (16 query heads on 8 KV heads of 128), one causal prompt per length, as
CachedAttention calls it (grouped-query attention without expanding K and V), best of 5. The
bfloat16 time includes rounding q, k and v to bf16 and the output back to float32, as a bf16
prefill path would pay them.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="72,512,2048")
    args = parser.parse_args()
    print(machine_header(), f"\ntorch {torch.get_num_threads()} threads")
    print(f"{'prompt':>8s} {'float32 ms':>12s} {'bfloat16 ms':>12s} {'bf16 / f32':>11s}")
    for n in (int(x) for x in args.lengths.split(",")):
        q, k, v = torch.randn(1, HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM)
        f32 = best_ms(lambda: attend(q, k, v, torch.float32))
        bf16 = best_ms(lambda: attend(q, k, v, torch.bfloat16))
        print(f"{n:8d} {f32:12.2f} {bf16:12.2f} {bf16 / f32:10.2f}x")


if __name__ == "__main__":
    main()
