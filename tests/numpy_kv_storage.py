"""A small, real KVStorage over numpy, for tests that check KV *data*, not only block counts.

Per layer one K and one V array of shape [capacity_slots, kv_heads, head_dim]. Capacity grows in
whole slabs of ``slab_blocks`` blocks inside ``ensure_blocks``; reading or writing a slot that was
never made addressable raises IndexError (so a cache that forgets ``ensure_blocks`` fails loudly).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from qwen_serve.kv.memory import kv_bytes_per_token


class NumpyKVStorage:
    def __init__(
        self,
        num_layers: int = 2,
        kv_heads: int = 1,
        head_dim: int = 2,
        block_size: int = 4,
        slab_blocks: int = 4,
        max_blocks: int | None = None,
        dtype: Any = np.float32,
    ) -> None:
        if slab_blocks <= 0 or block_size <= 0:
            raise ValueError("block_size and slab_blocks must be positive")
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.slab_blocks = slab_blocks
        self.max_blocks = max_blocks
        self.dtype = np.dtype(dtype)
        self.capacity_blocks = 0
        self.grow_calls = 0  # how many times the arrays were actually reallocated
        self.copy_calls = 0  # copy_block calls (copy-on-write copies)
        shape = (0, kv_heads, head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(num_layers)]
        self.v = [np.zeros(shape, self.dtype) for _ in range(num_layers)]

    # --- sizes -----------------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token() * self.block_size

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim, self.dtype.itemsize)

    # --- KVStorage -------------------------------------------------------------------------
    def ensure_blocks(self, num_blocks: int) -> None:
        if num_blocks <= self.capacity_blocks:
            return
        if self.max_blocks is not None and num_blocks > self.max_blocks:
            raise ValueError(f"{num_blocks} blocks requested, storage limited to {self.max_blocks}")
        new_blocks = -(-num_blocks // self.slab_blocks) * self.slab_blocks
        if self.max_blocks is not None:
            new_blocks = min(new_blocks, self.max_blocks)
        new_slots = new_blocks * self.block_size
        old_slots = self.capacity_blocks * self.block_size
        for arrays in (self.k, self.v):
            for layer, old in enumerate(arrays):
                # NaN marks never-written slots so reading them can't pass for real data
                grown = np.full((new_slots, self.kv_heads, self.head_dim), np.nan, self.dtype)
                grown[:old_slots] = old
                arrays[layer] = grown
        self.capacity_blocks = new_blocks
        self.grow_calls += 1

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        self._check(slots)
        self.k[layer][slots] = np.asarray(keys, self.dtype)
        self.v[layer][slots] = np.asarray(values, self.dtype)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        slots = np.asarray(slots, dtype=np.int64)
        self._check(slots)
        return self.k[layer][slots].copy(), self.v[layer][slots].copy()

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        self.copy_calls += 1
        self._check(np.array([src * bs, dst * bs + bs - 1], dtype=np.int64))
        for arrays in (self.k, self.v):
            for a in arrays:
                a[dst * bs:(dst + 1) * bs] = a[src * bs:(src + 1) * bs]

    def _check(self, slots: np.ndarray) -> None:
        # numpy would wrap negative indices silently; an out-of-range slot is a cache bug
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity_blocks * self.block_size):
            raise IndexError(
                f"slot out of range [0, {self.capacity_blocks * self.block_size}): "
                f"min {slots.min()}, max {slots.max()}"
            )
