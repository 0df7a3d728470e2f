"""Prefix-affinity ranking of engine replicas, independent of Ray (the router in routers.py
feeds it Ray's replica ids and calls it once per request).

A request arrives as the chained 16-token block hashes of its prompt (qwen_serve.kv.block_hash,
the engine's own): equal hash i means equal prompts up to the end of block i, so the number of
*leading* hashes a replica holds is how many prompt blocks its prefix cache can skip. For each
replica the policy remembers the hashes it routed there, at most that replica's KV pool in
blocks, in the order its cache would evict them (least recently used first, and within one
prompt the tail before the head, as the engine frees a sequence's blocks in reverse).

Choice, per request:
1. the load (requests in flight per replica) is imbalanced past ``imbalance_threshold``: the
   least-loaded replicas, whatever they hold;
2. else the replicas holding the longest leading run of the request's blocks, if that run is at
   least ``min_match_blocks``;
3. else (a prefix no replica holds) the replicas holding the fewest blocks, so new prefixes
   spread over the cluster instead of piling onto one replica.
Each choice is a first rank of replicas followed by the others (least loaded first), so a
router that finds the first rank full can fall back in order.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Hashable, Iterable, Mapping, Sequence, TypeVar

Replica = TypeVar("Replica", bound=Hashable)


class PrefixIndex:
    """The block hashes one replica likely holds, LRU-ordered, at most ``capacity_blocks``."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._lru

    def leading_matches(self, block_hashes: Sequence[bytes]) -> int:
        """How many of the first hashes, without a gap, are held (a chain breaks at a miss)."""
        for i, block_hash in enumerate(block_hashes):
            if block_hash not in self._lru:
                return i
        return len(block_hashes)

    def touch(self, block_hashes: Sequence[bytes]) -> None:
        """The replica now holds these blocks, most recently used; the head of the prompt is
        the youngest, so eviction eats its tail first."""
        for block_hash in reversed(block_hashes):
            self._lru[block_hash] = None
            self._lru.move_to_end(block_hash)
        self.resize(self.capacity_blocks)

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        while len(self._lru) > capacity_blocks:
            self._lru.popitem(last=False)


class AffinityPolicy(Generic[Replica]):
    def __init__(self, capacity_blocks: int, imbalance_threshold: int, min_match_blocks: int = 1) -> None:
        if imbalance_threshold < 0 or min_match_blocks < 1:
            raise ValueError("imbalance_threshold must be >= 0 and min_match_blocks >= 1")
        self.default_capacity = capacity_blocks
        self.imbalance_threshold = imbalance_threshold
        self.min_match_blocks = min_match_blocks
        self.indexes: dict[Replica, PrefixIndex] = {}

    def sync_replicas(self, replicas: Iterable[Replica]) -> None:
        """Forget replicas that are gone (a replacement starts with an empty cache)."""
        current = set(replicas)
        for gone in [r for r in self.indexes if r not in current]:
            del self.indexes[gone]
        for new in current - self.indexes.keys():
            self.indexes[new] = PrefixIndex(self.default_capacity)

    def forget(self, replica: Replica) -> None:
        self.indexes.pop(replica, None)

    def set_capacity(self, replica: Replica, capacity_blocks: int) -> None:
        """The replica's own report of its KV pool size."""
        if capacity_blocks > 0:
            self._index(replica).resize(capacity_blocks)

    def rank(self, block_hashes: Sequence[bytes], loads: Mapping[Replica, int]) -> list[list[Replica]]:
        """Ranks of the candidate replicas (the keys of ``loads``), most preferred first."""
        if not loads:
            return []
        by_load = sorted(loads, key=lambda r: (loads[r], len(self._index(r))))
        lightest = loads[by_load[0]]
        if loads[by_load[-1]] - lightest > self.imbalance_threshold:
            first = [r for r in by_load if loads[r] == lightest]
        else:
            matches = {r: self._index(r).leading_matches(block_hashes) for r in loads}
            best = max(matches.values())
            if best >= self.min_match_blocks:
                first = [r for r in by_load if matches[r] == best]
            else:
                fewest = min(len(self._index(r)) for r in loads)
                first = [r for r in by_load if len(self._index(r)) == fewest]
        rest = [r for r in by_load if r not in first]
        return [first, rest] if rest else [first]

    def routed(self, replica: Replica, block_hashes: Sequence[bytes]) -> None:
        """The request went to ``replica``: its prompt blocks are cached there from now on."""
        self._index(replica).touch(block_hashes)

    def _index(self, replica: Replica) -> PrefixIndex:
        index = self.indexes.get(replica)
        if index is None:
            index = self.indexes[replica] = PrefixIndex(self.default_capacity)
        return index
