"""Recurrent state: what a linear-attention layer keeps per sequence instead of keys and values
per token. The backend holds the arrays (StateStorage, addressed by slot like KV blocks); a cache
that serves a model with such layers hands each sequence a slot (RecurrentState); a backend that
can run such layers makes the storage (HoldsRecurrentState)."""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class StateStorage(Protocol):
    """Per linear-attention layer, one convolution history and one recurrent state per slot."""

    def ensure_slots(self, num_slots: int) -> None:
        """Make slots < num_slots addressable."""

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        """(convolution histories, recurrent states) of the given slots, gathered (copies)."""

    def write(self, layer: int, slots: Any, conv: Any, recurrent: Any) -> None:
        """Store the given slots' convolution histories and recurrent states."""

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy one slot's state in every layer (a forked sequence continues from its parent's)."""

    def nbytes(self) -> int:
        """Bytes currently allocated."""

    def bytes_per_slot(self) -> int:
        """Bytes one sequence's state occupies over every linear-attention layer."""


@runtime_checkable
class RecurrentState(Protocol):
    """A cache that also holds each sequence's recurrent state. A sequence gets its slot with its
    first allocate_slots and loses it with free; the executor starts a chunk at position 0 from
    zeros, any later one from the slot's state, and leaves the slot holding the state after the
    chunk's last position."""

    state_storage: StateStorage

    def state_slot(self, seq_id: int) -> int: ...

    def snapshot_slots(self, seq_id: int, start: int, stop: int, num_draft: int = 0) -> Sequence[tuple[int, int]]:
        """For a chunk of positions [start, stop) of which the last num_draft are speculative
        drafts: (p, slot) pairs asking the executor to also copy the state after p tokens
        (start < p <= stop) into slot, for prefix caching and, in a cache that rewinds, for
        rolling back rejected drafts. A p may come twice (two slots want the same state)."""


@runtime_checkable
class HoldsRecurrentState(Protocol):
    """A backend that runs linear-attention layers and keeps their state."""

    def create_state_storage(self, config: Any, max_slots: int) -> StateStorage:
        """Storage for up to max_slots sequences' states of the model `config` (a ModelConfig)."""
