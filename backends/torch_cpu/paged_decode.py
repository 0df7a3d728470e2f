"""Decode attention that reads the backend's own KV storage in place (kernels/paged_attention.cpp):
each decoding sequence's keys and values are read block by block through its block table, so no
step gathers a sequence's whole history into a new tensor (the gather's cost grows with context).

The dispatch point: only the core caches (PagedKVCache, NaiveKVCache; exact types) over this
backend's TorchKVStorage, float32 or bfloat16, on an AVX-512 CPU. Any other cache (a third-party
one, a subclass, int8 or sliding-window caches arriving through the Protocols) may store or
order keys differently, so it keeps the generic path: KVCache.read, then SDPA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen_serve.kv.naive import NaiveKVCache
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.protocols import KVCache, StepBatch

from .kv_storage import KERNEL_DTYPES, TorchKVStorage
from .native import Kernels, load_kernels

IN_PLACE_CACHES = (PagedKVCache, NaiveKVCache)


@dataclass
class PagedDecode:
    """This step's decoding sequences as the kernel reads them (built once, used by every layer)."""

    storage: TorchKVStorage
    block_tables: torch.Tensor  # [B, max blocks] int64, zero-padded
    lengths: torch.Tensor  # [B] int64: positions to attend, the new one included
    kernels: Kernels

    def attend(self, layer: int, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """queries [B, H, D] float32, rows at a stride (the q columns of the merged q/k/v output)
        -> [B, H, D]."""
        return self.kernels.ops.paged_decode_avx512(
            queries, self.storage.keys[layer], self.storage.values[layer],
            self.block_tables, self.lengths, self.storage.block_size, scale)


def reads_in_place(cache: KVCache, kernels: Kernels | None) -> bool:
    if kernels is None or kernels.isa != "avx512" or type(cache) not in IN_PLACE_CACHES:
        return False
    storage = cache.storage
    return type(storage) is TorchKVStorage and storage.dtype in KERNEL_DTYPES


def paged_decode_layout(batch: StepBatch, cache: KVCache, kernels: Kernels | None = None) -> PagedDecode | None:
    """The in-place layout for the step's single-token chunks, or None for the generic path."""
    kernels = load_kernels() if kernels is None else kernels
    decodes = [c for c in batch.chunks if len(c.token_ids) == 1]
    if not decodes or not reads_in_place(cache, kernels):
        return None
    bs = cache.block_size
    lengths = [c.start + 1 for c in decodes]
    tables = [list(cache.block_table(c.seq_id)[: -(-n // bs)]) for c, n in zip(decodes, lengths)]
    padded = torch.zeros((len(tables), max(map(len, tables))), dtype=torch.long)
    for row, table in zip(padded, tables):
        row[: len(table)] = torch.as_tensor(table, dtype=torch.long)
    return PagedDecode(cache.storage, padded, torch.as_tensor(lengths, dtype=torch.long), kernels)
