"""Decode attention that reads the backend's own KV storage in place (kernels/paged_attention.cpp):
each decoding sequence's keys and values are read block by block through its block table, so no
step gathers a sequence's whole history into a new tensor (the gather's cost grows with context).

The dispatch point: only the core caches (PagedKVCache, NaiveKVCache; exact types, or either
inside the core's HybridCache, which keeps a hybrid model's recurrent states beside) over this
backend's TorchKVStorage, float32 or bfloat16, on a CPU with the kernels (AVX-512 or AVX2: one
algorithm at two vector widths). Any other cache (a third-party one, a subclass, int8 or
sliding-window caches arriving through the Protocols) may store or order keys differently, so it
keeps the generic path: KVCache.read, then SDPA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen_serve.kv.hybrid import HybridCache
from qwen_serve.kv.naive import NaiveKVCache
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.protocols import KVCache

from .kv_storage import KERNEL_DTYPES, TorchKVStorage
from .native import Kernels
from .step_layout import StepLayout

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
        return self.kernels.op("paged_decode")(
            queries, self.storage.keys[layer], self.storage.values[layer],
            self.block_tables, self.lengths, self.storage.block_size, scale)


def reads_in_place(cache: KVCache, kernels: Kernels | None) -> bool:
    if isinstance(cache, HybridCache):  # the attention layers' KV is the wrapped cache's
        cache = cache.kv
    if kernels is None or type(cache) not in IN_PLACE_CACHES:
        return False
    storage = cache.storage
    return type(storage) is TorchKVStorage and storage.dtype in KERNEL_DTYPES


def paged_decode_layout(step: StepLayout, cache: KVCache, kernels: Kernels | None) -> PagedDecode | None:
    """The in-place layout for the step's single-token chunks, or None for the generic path."""
    if not step.decodes or not reads_in_place(cache, kernels):
        return None
    bs = cache.block_size
    tables = [list(d.block_table[: -(-d.length // bs)]) for d in step.decodes]
    width = max(map(len, tables))
    padded = torch.tensor([table + [0] * (width - len(table)) for table in tables], dtype=torch.long)
    lengths = torch.tensor([d.length for d in step.decodes], dtype=torch.long)
    return PagedDecode(cache.storage, padded, lengths, kernels)
