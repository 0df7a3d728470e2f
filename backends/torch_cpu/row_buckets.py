"""Row counts of x rounded up to a few sizes before a oneDNN matmul.

oneDNN (and ideep above it, in torch) keeps a primitive per input shape in caches of up to 1,024
entries each, so a server that sees every prompt length grows by each new one: a 1,000-request
soak on SmolLM2 grew RSS 20% (1,284 -> 1,540 MiB, all of it malloc'd and still held; capping
both caches at one entry kept it flat within 0.3%, `python benchmarks/soak.py`). Decode sizes
(up to EXACT_ROWS) stay exact; past them a count is rounded up to a multiple of 16, and of 1/8
of its power of two past 128 (at most 15 rows or 1/8 more), so prefill chunks of up to 512 rows
take 23 shapes and the caches stop growing once those have been seen.
"""
from __future__ import annotations

import torch

EXACT_ROWS = 16


def bucket_rows(rows: int) -> int:
    if rows <= EXACT_ROWS:
        return rows
    step = max(EXACT_ROWS, 1 << (rows.bit_length() - 4))
    return -(-rows // step) * step


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] with zero rows appended up to bucket_rows(rows)."""
    extra = bucket_rows(x.shape[0]) - x.shape[0]
    return x if extra == 0 else torch.cat((x, x.new_zeros((extra, x.shape[1]))))
