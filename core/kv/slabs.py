"""Slab growth, shared by every backend's KV storage: capacity grows a whole slab of blocks at a
time, so resident memory follows the highest block handed out, never the configured pool."""
from __future__ import annotations

from abc import ABC, abstractmethod


def grown_capacity(num_blocks: int, capacity: int, slab_blocks: int, max_blocks: int) -> int | None:
    """Blocks to hold so ids < num_blocks are addressable; None when capacity already does."""
    if num_blocks <= capacity:
        return None
    if num_blocks > max_blocks:
        raise ValueError(f"block id {num_blocks - 1} is outside the pool of {max_blocks} blocks")
    slabs = -(-num_blocks // slab_blocks)
    return min(max_blocks, slabs * slab_blocks)


class SlabGrownStorage(ABC):
    """The bookkeeping half of a backend's KVStorage: geometry and capacity. Subclasses hold the
    arrays and implement ``_grow(new_blocks)`` for their array library."""

    def __init__(self, block_size: int, slab_blocks: int, max_blocks: int) -> None:
        self.block_size = block_size
        self.slab_blocks = slab_blocks
        self.max_blocks = max_blocks
        self.capacity_blocks = 0

    def ensure_blocks(self, num_blocks: int) -> None:
        new_blocks = grown_capacity(num_blocks, self.capacity_blocks, self.slab_blocks, self.max_blocks)
        if new_blocks is not None:
            self._grow(new_blocks)
            self.capacity_blocks = new_blocks

    @abstractmethod
    def _grow(self, new_blocks: int) -> None:
        """Resize every layer's arrays to new_blocks blocks, keeping what they hold."""
