"""A cache for models whose layers mix attention and linear attention (Qwen3.5, Qwen3-Next): the
attention layers' keys and values in any KV cache, wrapped, and each sequence's recurrent state
in a slot of the backend's StateStorage.

A sequence takes a slot with its first allocation and gives it back with free (finishing,
aborting or preemption: recomputation starts again from position 0, from zeros). A forked
sequence gets a copy of its parent's state, since a state changes with every step and cannot be
shared the way a full KV block is. Prefix caching and rewinding are not offered yet: a prefix hit
would need the state at the hit's last position, and a rejected draft the state before it."""
from __future__ import annotations

from typing import Any, Sequence

from ..protocols import Forking, KVCache, KVUsage, LossyKV, StateStorage


class HybridCache:
    def __init__(self, kv: KVCache, state_storage: StateStorage, num_slots: int) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.state_storage = state_storage
        self.num_slots = num_slots
        self._free_slots = list(range(num_slots - 1, -1, -1))  # lowest first: storage grows only as needed
        self._slots: dict[int, int] = {}
        if isinstance(kv, LossyKV):
            self.exact_counterpart = kv.exact_counterpart

    @property
    def storage(self) -> Any:
        """The wrapped cache's KV storage (the executor may read it in place, as the wrapped cache's)."""
        return self.kv.storage

    def usage(self) -> KVUsage:
        usage = self.kv.usage()
        return KVUsage(usage.total, usage.used, usage.cached, usage.prefix_hit_blocks, usage.cow_copies,
                       states_total=self.num_slots, states_used=len(self._slots))

    def can_fit(self, num_tokens: int) -> bool:
        return self.kv.can_fit(num_tokens)

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        fresh = seq_id not in self._slots
        if fresh and not self._take_slot(seq_id):
            return False
        if self.kv.allocate_slots(seq_id, start, num_tokens, expected_total):
            return True
        if fresh:
            self._release_slot(seq_id)
        return False

    def free(self, seq_id: int) -> None:
        self.kv.free(seq_id)
        self._release_slot(seq_id)

    def block_table(self, seq_id: int) -> Sequence[int]:
        return self.kv.block_table(seq_id)

    def state_slot(self, seq_id: int) -> int:
        return self._slots[seq_id]

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        self.kv.write(layer, slots, keys, values)

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        return self.kv.read(layer, slots)

    def _take_slot(self, seq_id: int) -> bool:
        if not self._free_slots:
            return False
        slot = self._free_slots.pop()
        self.state_storage.ensure_slots(slot + 1)
        self._slots[seq_id] = slot
        return True

    def _release_slot(self, seq_id: int) -> None:
        slot = self._slots.pop(seq_id, None)
        if slot is not None:
            self._free_slots.append(slot)


class ForkingHybridCache(HybridCache):
    """A HybridCache over a cache that forks (copy-on-write blocks)."""

    kv: Forking

    def fork(self, parent_id: int, child_id: int) -> None:
        if not self._take_slot(child_id):
            raise RuntimeError(f"no recurrent-state slot left to fork sequence {parent_id}")
        self.kv.fork(parent_id, child_id)
        self.state_storage.copy_slot(self._slots[parent_id], self._slots[child_id])


def with_recurrent_state(kv: KVCache, state_storage: StateStorage, num_slots: int) -> HybridCache:
    """kv wrapped to hold num_slots sequences' recurrent states too."""
    return (ForkingHybridCache if isinstance(kv, Forking) else HybridCache)(kv, state_storage, num_slots)
