"""Block bookkeeping for the paged KV cache: ref counts, free blocks, and the prefix-cache map.

No tensors here. A block is in exactly one of three states:
  fresh      ref 0, no hash         -> counted free
  evictable  ref 0, holds a hash    -> counted used (the prefix cache holds it), reusable by eviction
  in use     ref > 0                -> counted used
Fresh blocks are handed out lowest id first so backend storage grows only as far as needed;
evictable blocks leave in LRU order (least recently released first).
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Iterable

from ..protocols import BlockMap

BlockHash = bytes


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self._fresh = list(range(num_blocks))  # a min-heap (sorted list is a valid heap)
        self._evictable: OrderedDict[int, None] = OrderedDict()  # head = evict first
        self.cached_block_hash_to_block: dict[BlockHash, int] = {}
        self.copied: set[int] = set()  # in-use blocks that are a copy-on-write copy (for describe())

    # --- counts -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._fresh)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._fresh)

    @property
    def num_cached(self) -> int:
        return len(self.cached_block_hash_to_block)

    @property
    def num_allocatable(self) -> int:
        """Free blocks plus cached blocks that nobody but the cache holds."""
        return len(self._fresh) + len(self._evictable)

    def evictable_blocks(self) -> list[int]:
        """In eviction order (first is evicted first)."""
        return list(self._evictable)

    # --- allocation ---------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n blocks with ref count 1, or None (and no change) if there is no room."""
        if n > self.num_allocatable:
            return None
        blocks = []
        for _ in range(n):
            if self._fresh:
                block = heapq.heappop(self._fresh)
            else:
                block, _ = self._evictable.popitem(last=False)
                self._forget_hash(block)
            self.ref_cnt[block] = 1
            blocks.append(block)
        return blocks

    def retain(self, block: int) -> None:
        """Another holder for a block in use or in the prefix cache."""
        if self.ref_cnt[block] == 0:
            if block not in self._evictable:
                raise ValueError(f"block {block} is free; allocate it instead of retaining it")
            del self._evictable[block]
        self.ref_cnt[block] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one holder of each block; pass a sequence's blocks tail first so that the tail
        of a cached chain is evicted before its head."""
        for block in blocks:
            if self.ref_cnt[block] <= 0:
                raise ValueError(f"block {block} released more times than it was held")
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.copied.discard(block)
                if self.block_hash[block] is not None:
                    self._evictable[block] = None
                else:
                    heapq.heappush(self._fresh, block)

    def describe(self) -> BlockMap:
        """Each block's state (see BlockMap)."""
        letters: list[str] = []
        shared: dict[int, int] = {}
        for block, refs in enumerate(self.ref_cnt):
            if refs == 0:
                letters.append(BlockMap.FREE if self.block_hash[block] is None else BlockMap.CACHED)
            elif refs > 1:
                letters.append(BlockMap.SHARED)
                shared[block] = refs
            else:
                letters.append(BlockMap.COPIED if block in self.copied else BlockMap.IN_USE)
        return BlockMap("".join(letters), shared)

    # --- prefix cache -------------------------------------------------------------------
    def publish(self, block: int, block_hash: BlockHash) -> bool:
        """Make a full, written block findable by its chained hash. A block whose content is
        already cached under another id stays private (and returns to fresh when released)."""
        if self.ref_cnt[block] <= 0:
            raise ValueError(f"block {block} is not in use")
        if block_hash in self.cached_block_hash_to_block or self.block_hash[block] is not None:
            return False
        self.block_hash[block] = block_hash
        self.cached_block_hash_to_block[block_hash] = block
        return True

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def _forget_hash(self, block: int) -> None:
        block_hash = self.block_hash[block]
        if block_hash is not None:
            del self.cached_block_hash_to_block[block_hash]
            self.block_hash[block] = None
