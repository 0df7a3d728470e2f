"""A cache for models whose layers mix attention and linear attention (Qwen3.5, Qwen3-Next): the
attention layers' keys and values in any KV cache, wrapped, and each sequence's recurrent state
in a slot of the backend's StateStorage.

A sequence takes a live slot with its first allocation and gives it back with free (finishing,
aborting or preemption: recomputation starts again from position 0, from zeros). A forked
sequence gets a copy of its parent's state, since a state changes with every step and cannot be
shared the way a full KV block is.

Prefix caching (PrefixCachingHybridCache, when the wrapped cache has it): a state holds a whole prefix, so a hit needs the
state at the hit's last position. The executor copies the state at every block boundary inside a
chunk, prefill or decode, into a snapshot slot (``snapshot_slots``); publishing the sequence's blocks files
each snapshot under the chained hash of the block ending there, so a later prompt's hit backs off
to the deepest boundary that has a snapshot, copies it into its live slot and computes on from
there. Snapshots take at most snapshot_slots slots, least recently used evicted first but
for the landmarks every 512 tokens, which go after the rest (snapshot_index.py); live slots never
wait for them.

Rewinding (RewindingHybridCache, when the wrapped cache rewinds and draft_slots > 0): a state
cannot be undone, so a chunk that ends in k speculative drafts also leaves the state after each
position a rewind may return to in k draft slots (the executor writes them as it does snapshots);
rewinding to one copies it into the live slot, and every draft slot goes back. Each live
sequence has draft_slots of them reserved, so a step never waits for one."""
from __future__ import annotations

from functools import cache
from typing import Any, Sequence

from ..protocols import (
    BlockMap,
    DescribesBlocks,
    Forking,
    KVCache,
    KVUsage,
    LossyKV,
    PrefixCaching,
    RecurrentState,
    Rewinding,
    ScheduledChunk,
    StateStorage,
)
from .block_hash import ROOT_HASH, chain_hashes
from .snapshot_index import LANDMARK_TOKENS, SnapshotIndex


class HybridCache:
    def __init__(self, kv: KVCache, state_storage: StateStorage, live_slots: int, snapshot_slots: int = 0,
                 draft_slots: int = 0) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.state_storage = state_storage
        self.live_slots, self.snapshot_capacity, self.draft_slots = live_slots, snapshot_slots, draft_slots
        total = live_slots * (1 + draft_slots) + snapshot_slots
        self._free = list(range(total - 1, -1, -1))  # lowest first: the storage grows only as far as used
        self._live: dict[int, int] = {}
        self._pending: dict[int, dict[int, int]] = {}  # seq -> {position: slot} written, not yet published
        self._drafts: dict[int, tuple[int, dict[int, int]]] = {}  # seq -> (its chunk's end, {position: slot})
        self._snapshots = SnapshotIndex(snapshot_slots)  # block hash -> slot
        self._landmark_every = max(1, LANDMARK_TOKENS // self.block_size) * self.block_size  # tokens
        self._chains: dict[int, list[bytes]] = {}  # seq -> hashes of its full blocks (as far as published)
        self.state_hit_tokens = 0  # what hits served (a hit backed off below evicted blocks matches twice in kv)
        if isinstance(kv, LossyKV):
            self.exact_counterpart = kv.exact_counterpart

    @property
    def storage(self) -> Any:
        """The wrapped cache's KV storage (the executor may read it in place, as the wrapped cache's)."""
        return self.kv.storage

    def usage(self) -> KVUsage:
        usage = self.kv.usage()
        held = len(self._live) + len(self._snapshots) + sum(map(len, self._pending.values())) + \
            sum(len(slots) for _, slots in self._drafts.values())
        return KVUsage(usage.total, usage.used, usage.cached, self.state_hit_tokens // self.block_size, usage.cow_copies,
                       states_total=self.live_slots * (1 + self.draft_slots) + self.snapshot_capacity, states_used=held,
                       state_snapshots=len(self._snapshots))

    def can_fit(self, num_tokens: int) -> bool:
        return self.kv.can_fit(num_tokens)

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        fresh = seq_id not in self._live
        if fresh and not self._take_live(seq_id):
            return False
        if self.kv.allocate_slots(seq_id, start, num_tokens, expected_total):
            return True
        if fresh:
            self._release(self._live.pop(seq_id))
        return False

    def free(self, seq_id: int) -> None:
        self.kv.free(seq_id)
        if seq_id in self._live:
            self._release(self._live.pop(seq_id))
        for slot in self._pending.pop(seq_id, {}).values():
            self._release(slot)
        for slot in self._drafts.pop(seq_id, (0, {}))[1].values():
            self._release(slot)
        self._chains.pop(seq_id, None)

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self.kv.block_table(seq_id)

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        self.kv.write(layer, slots, keys, values)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        return self.kv.read(layer, slots)

    # --- recurrent state ----------------------------------------------------------------
    def state_slot(self, seq_id: int) -> int:
        return self._live[seq_id]

    def snapshot_slots(self, seq_id: int, start: int, stop: int, num_draft: int = 0) -> list[tuple[int, int]]:
        """(position, slot) for each block boundary in (start, stop] that gets a snapshot: the
        executor copies the sequence's state after that many tokens into the slot (none where
        prefixes are not cached: no snapshot slots). num_draft: the chunk ends in that many
        drafts (a cache that rewinds adds the positions a rewind may return to). Where slots run
        short, the landmarks go first, then the boundaries from the chunk's end back."""
        if not self.snapshot_capacity:
            return []
        taken = []
        first = -(-(start + 1) // self.block_size) * self.block_size
        boundaries = range(stop // self.block_size * self.block_size, first - 1, -self.block_size)
        for position in sorted(boundaries, key=lambda p: p % self._landmark_every != 0):  # stable: landmarks first
            slot = self._take_snapshot_slot(landmark=position % self._landmark_every == 0)
            if slot is None:
                break
            self._pending.setdefault(seq_id, {})[position] = slot
            taken.append((position, slot))
        return sorted(taken)

    # --- slots --------------------------------------------------------------------------
    def _take_live(self, seq_id: int) -> bool:
        if len(self._live) >= self.live_slots:
            return False
        slot = self._take(evict=True)
        if slot is None:
            return False
        self._live[seq_id] = slot
        return True

    def _take_snapshot_slot(self, landmark: bool) -> int | None:
        held = len(self._snapshots) + sum(map(len, self._pending.values()))
        if held < self.snapshot_capacity:  # then a slot is free beyond what live sequences may still take
            return self._take(evict=False)
        return self._snapshots.evict(for_landmark=landmark)  # at its share: another snapshot's slot, if any

    def _take(self, evict: bool) -> int | None:
        if self._free:
            slot = self._free.pop()
            self.state_storage.ensure_slots(slot + 1)
            return slot
        return self._evict() if evict else None

    def _evict(self) -> int | None:
        return self._snapshots.evict(for_landmark=True)

    def _release(self, slot: int) -> None:
        self._free.append(slot)


class RewindingHybridCache(HybridCache):
    """A HybridCache that rolls a sequence back to before its rejected drafts."""

    kv: Rewinding

    def snapshot_slots(self, seq_id: int, start: int, stop: int, num_draft: int = 0) -> list[tuple[int, int]]:
        taken = super().snapshot_slots(seq_id, start, stop, num_draft)
        if not num_draft:
            return taken
        if num_draft > self.draft_slots:
            raise ValueError(f"a chunk of {num_draft} drafts; the cache keeps states for {self.draft_slots}")
        drafts = {position: self._take(evict=True) for position in range(stop - num_draft, stop)}
        self._drafts[seq_id] = (stop, drafts)
        return sorted(taken + list(drafts.items()))

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Keep positions [0, num_tokens): the live state goes back to the draft slot holding the
        state after num_tokens (unless that is the end of the last chunk); snapshots pending past
        it are dropped, since they hold rejected tokens."""
        self.kv.rewind(seq_id, num_tokens)
        stop, drafts = self._drafts.pop(seq_id, (num_tokens, {}))
        if num_tokens != stop:
            if num_tokens not in drafts:
                raise ValueError(f"sequence {seq_id}: no state after {num_tokens} tokens to rewind to")
            self.state_storage.copy_slot(drafts[num_tokens], self._live[seq_id])
        for slot in drafts.values():
            self._release(slot)
        pending = self._pending.get(seq_id, {})
        for position in [p for p in pending if p > num_tokens]:
            self._release(pending.pop(position))


class ForkingHybridCache(HybridCache):
    """A HybridCache over a cache that forks (copy-on-write blocks)."""

    kv: Forking

    def fork(self, parent_id: int, child_id: int) -> None:
        if not self._take_live(child_id):
            raise RuntimeError(f"no recurrent-state slot left to fork sequence {parent_id}")
        self.kv.fork(parent_id, child_id)
        self.state_storage.copy_slot(self._live[parent_id], self._live[child_id])
        self._chains[child_id] = list(self._chains.get(parent_id, ()))


class PrefixCachingHybridCache(HybridCache):
    """A HybridCache over a cache that shares prefixes, with snapshot slots: a hit goes only as
    deep as a snapshot of the state."""

    kv: PrefixCaching

    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """The wrapped cache's hit, backed off to the deepest block boundary with a snapshot; the
        snapshot becomes the sequence's live state."""
        hashes = chain_hashes(token_ids, self.block_size, (len(token_ids) - 1) // self.block_size)
        blocks = next((i + 1 for i in range(len(hashes) - 1, -1, -1) if hashes[i] in self._snapshots), 0)
        while blocks:
            hit = self.kv.match_prefix(seq_id, token_ids[:blocks * self.block_size + 1])
            if hit == blocks * self.block_size:
                break
            self.kv.free(seq_id)  # some of its blocks were evicted: back off below them
            blocks = next((i + 1 for i in range(hit // self.block_size - 1, -1, -1) if hashes[i] in self._snapshots), 0)
        if not blocks:
            return 0
        if seq_id not in self._live and not self._take_live(seq_id):
            self.kv.free(seq_id)
            return 0
        self.state_storage.copy_slot(self._snapshots.use(hashes[blocks - 1]), self._live[seq_id])
        self._chains[seq_id] = hashes[:blocks]
        self.state_hit_tokens += blocks * self.block_size
        return blocks * self.block_size

    def publish(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        self.kv.publish(seq_id, token_ids, num_computed)
        pending = self._pending.get(seq_id)
        if not pending:
            return
        chain = self._chains.setdefault(seq_id, [])
        full = num_computed // self.block_size
        if full > len(chain):
            chain += chain_hashes(token_ids, self.block_size, full - len(chain), chain[-1] if chain else ROOT_HASH,
                                  first_block=len(chain))
        for position in [p for p in pending if p <= num_computed]:
            slot, block_hash = pending.pop(position), chain[position // self.block_size - 1]
            if block_hash in self._snapshots:  # another sequence computed the same prefix first
                self._release(slot)
                self._snapshots.use(block_hash)
            else:
                self._snapshots.add(block_hash, slot, landmark=position % self._landmark_every == 0)


class DescribingHybridCache(HybridCache):
    """A HybridCache over a cache that can draw its blocks (the state slots are in usage())."""

    kv: DescribesBlocks

    def describe_blocks(self) -> BlockMap:
        return self.kv.describe_blocks()


def chunk_snapshots(cache: RecurrentState, chunk: ScheduledChunk) -> list[tuple[int, int]]:
    """(rows of the chunk, slot) for each state a chunk leaves for the prefix cache (the state
    after that many of its rows goes into slot): a decode's one row too, where it ends a block, so
    a next turn that sends the reply back resumes after it. Every backend's per-step layout asks
    this once per chunk."""
    taken = cache.snapshot_slots(chunk.seq_id, chunk.start, chunk.start + len(chunk.token_ids), chunk.num_draft)
    return sorted((p - chunk.start, slot) for p, slot in taken)


ABILITIES = ((Forking, ForkingHybridCache), (PrefixCaching, PrefixCachingHybridCache),
             (Rewinding, RewindingHybridCache), (DescribesBlocks, DescribingHybridCache))


def with_recurrent_state(kv: KVCache, state_storage: StateStorage, live_slots: int,
                         snapshot_slots: int = 0, draft_slots: int = 0) -> HybridCache:
    """kv wrapped to hold live_slots sequences' recurrent states; (if kv shares prefixes and
    snapshot_slots > 0) up to snapshot_slots states at block boundaries for prefix caching; (if
    kv rewinds and draft_slots > 0) draft_slots states per live sequence to roll back rejected
    drafts. The wrapper implements Forking, PrefixCaching and Rewinding only where it offers
    them (and DescribesBlocks where kv does), so the engine, the memory plan and the conformance
    checks read what it does from its type."""
    offered = {Forking: True, PrefixCaching: snapshot_slots > 0, Rewinding: draft_slots > 0, DescribesBlocks: True}
    kinds = tuple(kind for ability, kind in ABILITIES if isinstance(kv, ability) and offered[ability])
    return _composed(kinds)(kv, state_storage, live_slots, snapshot_slots if PrefixCachingHybridCache in kinds else 0,
                            draft_slots if RewindingHybridCache in kinds else 0)


@cache
def _composed(kinds: tuple[type, ...]) -> type:
    """One class with the given abilities (HybridCache itself for none), named after them, e.g.
    ForkingPrefixCachingHybridCache over the paged cache."""
    if len(kinds) <= 1:
        return kinds[0] if kinds else HybridCache
    return type("".join(kind.__name__.removesuffix("HybridCache") for kind in kinds) + "HybridCache", kinds, {})
