"""PagedKVCache: fixed-size blocks, per-sequence block tables, prefix sharing and copy-on-write.

Bookkeeping is done here with plain ints; tensors stay in the backend's KVStorage.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..protocols import BlockMap, KVStorage, KVUsage
from .block_hash import ROOT_HASH, chain_hashes
from .block_pool import BlockPool


class PagedKVCache:
    def __init__(self, storage: KVStorage, block_size: int, num_blocks: int, prefix_caching: bool = True) -> None:
        self.storage = storage
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.prefix_caching = prefix_caching
        self._tables: dict[int, list[int]] = {}
        self._hashes: dict[int, list[bytes]] = {}  # chained hashes of the sequence's full blocks
        self.prefix_hit_blocks = 0
        self.cow_copies = 0

    # --- engine side --------------------------------------------------------------------
    def usage(self) -> KVUsage:
        return KVUsage(
            total=self.pool.num_blocks,
            used=self.pool.num_used,
            cached=self.pool.num_cached,
            prefix_hit_blocks=self.prefix_hit_blocks,
            cow_copies=self.cow_copies,
        )

    def can_fit(self, num_tokens: int) -> bool:
        return self._blocks_for(num_tokens) <= self.pool.num_blocks

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        table = self._tables.get(seq_id, [])
        end = start + num_tokens
        if start > len(table) * self.block_size:
            raise ValueError(f"sequence {seq_id}: write at position {start} skips unallocated blocks")
        self._tables[seq_id] = table
        written_blocks = range(start // self.block_size, min(len(table), self._blocks_for(end)))
        shared = [i for i in written_blocks if self.pool.ref_cnt[table[i]] > 1]
        new_blocks = max(0, self._blocks_for(end) - len(table))
        fresh = self.pool.allocate(new_blocks + len(shared))
        if fresh is None:
            if not table:
                del self._tables[seq_id]
            return False
        if fresh:
            self.storage.ensure_blocks(max(fresh) + 1)
        for i in shared:  # copy before the first write into a block someone else still reads
            copy = fresh.pop()
            self.storage.copy_block(table[i], copy)
            self.pool.release([table[i]])
            table[i] = copy
            self.pool.copied.add(copy)
            self.cow_copies += 1
        table.extend(fresh)
        return True

    def free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id, [])
        self._hashes.pop(seq_id, None)
        self.pool.release(reversed(table))

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Blocks wholly past num_tokens go back (tail first); a published block never does."""
        table = self._tables.get(seq_id, [])
        keep = self._blocks_for(num_tokens)
        if len(self._hashes.get(seq_id, ())) * self.block_size > num_tokens:
            raise ValueError(f"sequence {seq_id}: cannot rewind to {num_tokens} tokens, its published blocks "
                             f"hold {len(self._hashes[seq_id]) * self.block_size}")
        if keep < len(table):
            self.pool.release(reversed(table[keep:]))
            del table[keep:]

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self._tables.get(seq_id, ())

    def describe_blocks(self) -> BlockMap:
        return self.pool.describe()

    def sequence_ids(self) -> list[int]:
        return list(self._tables)

    # --- prefix caching -----------------------------------------------------------------
    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        if self._tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} already holds blocks")
        if not self.prefix_caching:
            return 0
        candidates = (len(token_ids) - 1) // self.block_size  # the last token is always computed
        hits: list[int] = []
        hashes: list[bytes] = []
        parent = ROOT_HASH
        for i in range(candidates):
            (block_hash,) = chain_hashes(token_ids, self.block_size, 1, parent, first_block=i)
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            self.pool.retain(block)
            hits.append(block)
            hashes.append(block_hash)
            parent = block_hash
        self._tables[seq_id] = hits
        self._hashes[seq_id] = hashes
        self.prefix_hit_blocks += len(hits)
        return len(hits) * self.block_size

    def publish(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        hashes = self._hashes.setdefault(seq_id, [])
        table = self._tables[seq_id]
        full = min(num_computed // self.block_size, len(table))
        if full <= len(hashes):
            return
        parent = hashes[-1] if hashes else ROOT_HASH
        new = chain_hashes(token_ids, self.block_size, full - len(hashes), parent, first_block=len(hashes))
        for i, block_hash in enumerate(new, start=len(hashes)):
            if self.prefix_caching:
                self.pool.publish(table[i], block_hash)
        hashes.extend(new)

    # --- copy-on-write ------------------------------------------------------------------
    def fork(self, parent_id: int, child_id: int) -> None:
        if self._tables.get(child_id):
            raise ValueError(f"sequence {child_id} already holds blocks")
        table = list(self._tables.get(parent_id, ()))
        for block in table:
            self.pool.retain(block)
        self._tables[child_id] = table
        self._hashes[child_id] = list(self._hashes.get(parent_id, ()))

    # --- executor side ------------------------------------------------------------------
    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        self.storage.write(layer, slots, keys, values)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        return self.storage.read(layer, slots)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
