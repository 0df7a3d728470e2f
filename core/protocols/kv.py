"""What a KV cache is (KVStorage, KVCache) and the optional abilities the engine asks a cache
for with isinstance: prefix caching, forking, rewinding, a sliding window, lossy storage,
reserving ahead, describing its blocks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class KVUsage:
    """Block accounting of a KV cache at one moment (counts in blocks, states in slots)."""

    total: int
    used: int  # held by a sequence or by the prefix cache; used + free == total
    cached: int  # holding a published prefix hash (in use or evictable)
    prefix_hit_blocks: int = 0
    cow_copies: int = 0
    states_total: int = 0  # recurrent-state slots (a model with linear attention; protocols.state)
    states_used: int = 0  # held by a sequence or a prefix-cache snapshot
    state_snapshots: int = 0  # held by the prefix cache: states at block boundaries

    @property
    def free(self) -> int:
        return self.total - self.used


@runtime_checkable
class KVStorage(Protocol):
    """Backend memory for keys and values, addressed by slot = block_id * block_size + offset."""

    def ensure_blocks(self, num_blocks: int) -> None:
        """Make block ids < num_blocks addressable (storage grows in slabs, never per token)."""

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        """Store keys/values [n, kv_heads, head_dim] at the n given slots."""

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        """Gather keys/values at an index array of slots (any shape), in one call."""

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's keys/values in every layer (copy-on-write)."""

    def nbytes(self) -> int:
        """Bytes currently allocated."""

    def bytes_per_token(self) -> int:
        """Bytes one token's keys and values occupy in every layer, scales included (computed
        with qwen_serve.kv.memory), so memory figures follow the storage, not the dtype flag."""


@runtime_checkable
class KVCache(Protocol):
    """Where each sequence's keys and values live.

    The engine reserves room with ``allocate_slots`` and gives it back with ``free``; the model
    executor turns ``block_table`` into slots once per step and moves tensors with
    ``write``/``read``. A sequence's position p lives in slot
    ``block_table[p // block_size] * block_size + p % block_size``.
    """

    block_size: int

    def usage(self) -> KVUsage: ...

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a lone sequence of num_tokens could ever be held (to reject, not to wait)."""

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        """Make positions [start, start + num_tokens) writable; False changes nothing.

        expected_total is the longest the sequence may grow (prompt + max_tokens), a hint for
        caches that reserve up front.
        """

    def free(self, seq_id: int) -> None: ...

    def block_table(self, seq_id: int) -> Sequence[int]: ...

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None: ...

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class PrefixCaching(Protocol):
    """A cache that can serve a prompt's leading full blocks from earlier requests."""

    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Attach cached blocks for the longest known prefix; returns tokens reused.

        Never covers the last token, so the model always computes at least one position.
        """

    def publish(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Make the full blocks among the first num_computed positions findable."""


@runtime_checkable
class Forking(Protocol):
    """A cache that can share a sequence's blocks with a new one (copy-on-write)."""

    def fork(self, parent_id: int, child_id: int) -> None: ...


@runtime_checkable
class Rewinding(Protocol):
    """A cache that can forget a sequence's last positions (speculative decoding's rejected
    drafts), giving back blocks that end up holding none of its positions. Only positions the
    engine never committed are rewound, so a block published to the prefix cache (always a
    full block of committed positions) is never altered; a cache without this runs without
    speculation."""

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Keep positions [0, num_tokens) of seq_id; later ones are no longer held."""


@runtime_checkable
class SlidingWindow(Protocol):
    """A cache that keeps only each sequence's last ``window`` positions. A query at position q
    attends to keys at positions window_start(q) .. q, where window_start(q) =
    max(0, q - window + 1) (transformers' sliding-window mask); positions are absolute (RoPE is
    applied before the write), and block-table entries of blocks wholly before a sequence's
    window may be released (negative), so an executor gathers only positions inside it."""

    window: int

    def window_start(self, position: int) -> int: ...


@runtime_checkable
class LossyKV(Protocol):
    """A cache whose reads approximate what was written (quantized storage), so greedy tokens may
    drift from full precision. It names the exact cache with the same layout that it
    approximates; the conformance suite compares the two by logits instead of by tokens."""

    exact_counterpart: str  # registry name of that cache, e.g. "paged"


@runtime_checkable
class ReservesAhead(Protocol):
    """A cache that holds memory for a sequence's longest possible length up front, so its
    used blocks exceed the blocks its tokens fill (the cost paging removes)."""

    def reserved_tokens(self, seq_id: int) -> int: ...


@dataclass(frozen=True)
class BlockMap:
    """Every block's state at one moment, one letter a block (block id = index), for the engine
    view: FREE, CACHED (only the prefix cache holds it: reusable by eviction), IN_USE (one
    holder), SHARED (several holders; ``shared_refs`` gives their count) or COPIED (a sequence's
    private copy made by copy-on-write)."""

    FREE = "."
    CACHED = "c"
    IN_USE = "u"
    SHARED = "s"
    COPIED = "w"

    states: str
    shared_refs: dict[int, int]  # block -> holders, for the SHARED blocks


@runtime_checkable
class DescribesBlocks(Protocol):
    """A cache that can draw its block pool (the engine view at /engine). Called on the engine
    thread between steps, only while someone watches."""

    def describe_blocks(self) -> BlockMap: ...
