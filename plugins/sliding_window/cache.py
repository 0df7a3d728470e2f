"""SlidingWindowKVCache: each sequence keeps only its last `window` positions, on paged blocks.

A query at position q attends to positions q - window + 1 .. q (RoPE is applied before the
write, so a key keeps its absolute position wherever it is stored). A sequence's block table
maps logical block p // block_size to a pool block as in the paged cache, but blocks that fall
wholly behind the window leave it: they are reused for the sequence's next block or go back to
the pool. While decoding, a sequence holds at most blocks_spanned(window) blocks whatever its
length: the ring of the course material, made of blocks.

One wrinkle: the scheduler reserves a whole prompt at admission and then runs it in chunks of at
most chunk_size tokens with no further call here. So a long prompt is laid out as a ring over
blocks_spanned(window - 1 + chunk_size) blocks (logical block L reuses the block of L - ring):
enough that no chunk overwrites a position one of its own queries still reads. The first decode
step then gives back every block outside the window.

No prefix sharing and no forking: a block's contents depend on which positions the window kept.
"""
from __future__ import annotations

from typing import Any, Sequence

from qwen_serve.kv.block_pool import BlockPool
from qwen_serve.kv.memory import blocks_spanned
from qwen_serve.kv.window import window_start
from qwen_serve.protocols import BlockMap, KVStorage, KVUsage

RELEASED = -1  # block-table entry of a block that left the window


class SlidingWindowKVCache:
    def __init__(self, storage: KVStorage, block_size: int, num_blocks: int, window: int, chunk_size: int) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.storage = storage
        self.block_size = block_size
        self.window = window
        self.pool = BlockPool(num_blocks)
        self.ring_blocks = blocks_spanned(window - 1 + chunk_size, block_size)
        self._tables: dict[int, list[int]] = {}  # logical block -> pool block, RELEASED behind the window
        self._held: dict[int, list[int]] = {}  # the distinct pool blocks a sequence holds

    # --- SlidingWindow ------------------------------------------------------------------
    def window_start(self, position: int) -> int:
        return window_start(position, self.window)

    # --- engine side --------------------------------------------------------------------
    def usage(self) -> KVUsage:
        return KVUsage(total=self.pool.num_blocks, used=self.pool.num_used, cached=0)

    def describe_blocks(self) -> BlockMap:
        return self.pool.describe()

    def can_fit(self, num_tokens: int) -> bool:
        return min(self._blocks_for(num_tokens), self.ring_blocks) <= self.pool.num_blocks

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        bs = self.block_size
        table = self._tables.get(seq_id, [])
        if start > len(table) * bs:
            raise ValueError(f"sequence {seq_id}: write at position {start} skips unallocated blocks")
        total = self._blocks_for(start + num_tokens)
        first_live = self.window_start(start) // bs  # the oldest block a query from `start` on reads
        live = set(table[first_live:])
        behind = [b for b in self._held.get(seq_id, []) if b not in live]
        # The live blocks form a ring: its first `ring` logical blocks get their own pool block,
        # later ones reuse the block `ring` before them (only a prompt longer than the ring does).
        ring = min(total - first_live, max(self.ring_blocks, len(table) - first_live))
        needed = max(0, min(total, first_live + ring) - len(table))
        reused = behind[:needed]
        fresh = self.pool.allocate(needed - len(reused))
        if fresh is None:
            return False  # nothing changed
        if fresh:
            self.storage.ensure_blocks(max(fresh) + 1)
        self.pool.release(behind[needed:])
        table = [RELEASED] * first_live + table[first_live:]
        own = iter(reused + fresh)
        for logical in range(len(table), total):
            table.append(next(own) if logical < first_live + ring else table[logical - ring])
        self._tables[seq_id] = table
        self._held[seq_id] = sorted(set(table[first_live:]))
        return True

    def free(self, seq_id: int) -> None:
        self._tables.pop(seq_id, None)
        self.pool.release(self._held.pop(seq_id, []))

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self._tables.get(seq_id, ())

    def sequence_ids(self) -> list[int]:
        return list(self._tables)

    def held_blocks(self, seq_id: int) -> list[int]:
        return list(self._held.get(seq_id, ()))

    # --- executor side ------------------------------------------------------------------
    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        self.storage.write(layer, slots, keys, values)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        return self.storage.read(layer, slots)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
