"""Row counts of x rounded up to a few sizes before a oneDNN matmul, so that a row's result
depends on that row alone, never on how many rows share the call.

Batch invariance: oneDNN's float32 matmul takes a matrix-vector path at one row and other
kernels for the tails of a few rows, which add up a dot product in another order than its blocked
GEMM; so the logits of a request decoded alone differed from the same request decoded beside
seven others by up to 1e-5 in log-probability, enough to flip a seeded draw now and then. At row
counts that are multiples of ROW_QUANTUM every row came out bit-identical to the same row in a
600-row call (SmolLM2's projections, prepacked, and its unpacked float32 head: multiples of 4, or
12 and more rows, Zen 4); tests/test_batch_invariance.py checks it on the machine at hand.

Shape caches: oneDNN (and ideep above it, in torch) keeps a primitive per input shape in caches
of up to 1,024 entries each, so a server that sees every prompt length grows by each new one: a
1,000-request soak on SmolLM2 grew RSS 20% (1,284 -> 1,540 MiB, all of it malloc'd and still
held; capping both caches at one entry kept it flat within 0.3%, `python benchmarks/soak.py`).
Decode sizes (up to SMALL_ROWS) take multiples of ROW_QUANTUM; past them a count is rounded up
to a multiple of 16, and of 1/8 of its power of two past 128 (at most 15 rows or 1/8 more), so
prefill chunks of up to 512 rows take 23 shapes and the caches stop growing once those have been
seen.
"""
from __future__ import annotations

import torch

SMALL_ROWS = 16
ROW_QUANTUM = 4  # divides SMALL_ROWS, so every bucket is a multiple of it


def bucket_rows(rows: int) -> int:
    if rows <= SMALL_ROWS:
        return -(-rows // ROW_QUANTUM) * ROW_QUANTUM
    step = max(SMALL_ROWS, 1 << (rows.bit_length() - 4))
    return -(-rows // step) * step


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] with zero rows appended up to bucket_rows(rows)."""
    extra = bucket_rows(x.shape[0]) - x.shape[0]
    return x if extra == 0 else torch.cat((x, x.new_zeros((extra, x.shape[1]))))
