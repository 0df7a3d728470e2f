"""Which recurrent-state snapshots the prefix cache keeps, and which it gives up first.

A snapshot is the state after a block boundary; a hit resumes at the deepest boundary that has
one. Every boundary gets a snapshot as prompts prefill, so a prompt hits within a block of where
it parts from an earlier one. But a state is large (Qwen3.5-0.8B: 19 MiB over its 18 linear
layers, against 12 KiB of bf16 KV a token), so the default 1 GiB holds 53 of them: plain LRU keeps
only the last ~850 tokens' boundaries of whatever prefilled last. Two agents with 15k-token prompts sharing their first 12k
tokens then share nothing: the first one's boundaries up to 12k are gone before the second
arrives.

So the boundaries every LANDMARK_TOKENS (the default prefill chunk, 512) are landmarks, kept
apart and given up only after the others, while they hold at most half the slots: a long prompt
keeps a resume point every 512 tokens for as long as it stays in use, and the latest boundaries
of everything still serve the close matches (a shared system prompt right after it prefilled).
"""
from __future__ import annotations

from collections import OrderedDict

LANDMARK_TOKENS = 512


class SnapshotIndex:
    """Block hash -> snapshot slot, in two least-recently-used orders: landmarks and the rest."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._fine: OrderedDict[bytes, int] = OrderedDict()
        self._landmarks: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._fine) + len(self._landmarks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._fine or block_hash in self._landmarks

    def use(self, block_hash: bytes) -> int:
        """The slot of a snapshot held, now the most recently used of its kind."""
        kind = self._landmarks if block_hash in self._landmarks else self._fine
        kind.move_to_end(block_hash)
        return kind[block_hash]

    def add(self, block_hash: bytes, slot: int, landmark: bool) -> None:
        (self._landmarks if landmark else self._fine)[block_hash] = slot

    def evict(self, for_landmark: bool) -> int | None:
        """The slot of a snapshot to give up for a new one (None: keep them all): the least
        recently used landmark while landmarks hold more than half the capacity, else the least
        recently used of the rest; a landmark only for a new landmark, when no other is held."""
        if self._landmarks and 2 * len(self._landmarks) > self.capacity:
            return self._landmarks.popitem(last=False)[1]
        if self._fine:
            return self._fine.popitem(last=False)[1]
        return self._landmarks.popitem(last=False)[1] if for_landmark and self._landmarks else None
