"""Slab growth, shared by every backend's KV storage: capacity grows a whole slab of blocks at a
time, so resident memory follows the highest block handed out, never the configured pool."""
from __future__ import annotations


def grown_capacity(num_blocks: int, capacity: int, slab_blocks: int, max_blocks: int) -> int | None:
    """Blocks to hold so ids < num_blocks are addressable; None when capacity already does."""
    if num_blocks <= capacity:
        return None
    if num_blocks > max_blocks:
        raise ValueError(f"block id {num_blocks - 1} is outside the pool of {max_blocks} blocks")
    slabs = -(-num_blocks // slab_blocks)
    return min(max_blocks, slabs * slab_blocks)
