"""NaiveKVCache: each sequence gets one contiguous run of slots, reserved up front for its
longest possible length (prompt + max_tokens), as servers did before paging. No sharing.

It speaks the same KVCache Protocol as the paged cache (a contiguous run is a block table of
consecutive ids), so the model executor runs on it unchanged; what it shows is the cost:
reserved-but-unused slots and free space too fragmented to fit a new sequence.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..protocols import BlockMap, KVStorage, KVUsage


class NaiveKVCache:
    def __init__(self, storage: KVStorage, block_size: int, num_blocks: int) -> None:
        self.storage = storage
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._runs: dict[int, tuple[int, int]] = {}  # seq_id -> (first block, block count)

    def usage(self) -> KVUsage:
        used = sum(count for _, count in self._runs.values())
        return KVUsage(total=self.num_blocks, used=used, cached=0)

    def can_fit(self, num_tokens: int) -> bool:
        return self._blocks_for(num_tokens) <= self.num_blocks

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        end = start + num_tokens
        run = self._runs.get(seq_id)
        if run is not None:
            return end <= run[1] * self.block_size  # a contiguous run cannot grow in place
        count = self._blocks_for(max(end, expected_total))
        first = self._first_fit(count)
        if first is None:
            return False
        self.storage.ensure_blocks(first + count)
        self._runs[seq_id] = (first, count)
        return True

    def free(self, seq_id: int) -> None:
        self._runs.pop(seq_id, None)

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Nothing to give back: the run stays reserved for the sequence's longest length, and
        positions past num_tokens are simply written again."""
        if num_tokens > self.reserved_tokens(seq_id):
            raise ValueError(f"sequence {seq_id}: cannot rewind to {num_tokens} tokens, it holds "
                             f"{self.reserved_tokens(seq_id)}")

    def reserved_tokens(self, seq_id: int) -> int:
        return self._runs.get(seq_id, (0, 0))[1] * self.block_size

    def describe_blocks(self) -> BlockMap:
        """Each run in use from its first block, whatever its tokens fill (that is what it costs)."""
        states = [BlockMap.FREE] * self.num_blocks
        for first, count in self._runs.values():
            states[first:first + count] = BlockMap.IN_USE * count
        return BlockMap("".join(states), {})

    def block_table(self, seq_id: int) -> Sequence[int]:
        first, count = self._runs.get(seq_id, (0, 0))
        return range(first, first + count)

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        self.storage.write(layer, slots, keys, values)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        return self.storage.read(layer, slots)

    def _first_fit(self, count: int) -> int | None:
        cursor = 0
        for first, size in sorted(self._runs.values()):
            if first - cursor >= count:
                return cursor
            cursor = first + size
        return cursor if self.num_blocks - cursor >= count else None

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)
