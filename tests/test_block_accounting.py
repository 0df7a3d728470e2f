"""Block accounting of the KV caches (check 5).

The state machine keeps its own model of the pool (ref counts, fresh set, prefix cache keyed by
the token prefix, LRU list) and predicts every result before asking PagedKVCache; KV data goes
through a real numpy storage so sharing / copy-on-write are checked on the values, not on counts.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from engine_steps import assert_blocks_accounted, step_until_done
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from qwen_serve.kv.naive import NaiveKVCache
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.protocols import Forking, KVCache, KVStorage, PrefixCaching

try:  # works whether or not tests/ is a package, and under --import-mode=importlib
    from .numpy_kv_storage import NumpyKVStorage
except ImportError:
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from numpy_kv_storage import NumpyKVStorage

BS = 4
LAYERS = 2
SLAB = 4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def encode(layer: int, tokens, positions):
    """K/V rows [n, 1, 2] that identify (layer, token id, position) exactly in float32, and
    exactly in int8 with a per-row absmax scale too: each row is (127, c) x ident with c a small
    integer, so its scale is ident and its codes are 127 and c (the int8 cache runs this machine)."""
    tok = np.asarray(tokens, dtype=np.float64)
    pos = np.asarray(positions, dtype=np.float64)
    ident = tok * 1000 + pos
    keys = np.stack([127 * ident, layer * ident], axis=-1)[:, None, :]
    values = np.stack([-127 * ident, (layer + 10) * ident], axis=-1)[:, None, :]
    return keys.astype(np.float32), values.astype(np.float32)


def slots_of(table, positions, bs: int = BS) -> np.ndarray:
    return np.array([table[p // bs] * bs + p % bs for p in positions], dtype=np.int64)


def write_tokens(cache, seq_id: int, start: int, tokens, bs: int = BS, layers: int = LAYERS) -> None:
    table = list(cache.block_table(seq_id))
    positions = range(start, start + len(tokens))
    slots = slots_of(table, positions, bs)
    for layer in range(layers):
        k, v = encode(layer, tokens, positions)
        cache.write(layer, slots, k, v)


def assert_reads(cache, table, tokens, bs: int = BS, layers: int = LAYERS, what: str = "") -> None:
    positions = range(len(tokens))
    slots = slots_of(table, positions, bs)
    for layer in range(layers):
        k, v = cache.read(layer, slots)
        ek, ev = encode(layer, tokens, positions)
        assert k.shape == ek.shape, what
        np.testing.assert_array_equal(k, ek, err_msg=f"keys {what} layer {layer}")
        np.testing.assert_array_equal(v, ev, err_msg=f"values {what} layer {layer}")


# ------------------------------------------------------------------------------------------
# State machine
# ------------------------------------------------------------------------------------------
SHARED_PREFIXES = [(), (1, 1, 1, 1, 2, 2, 2, 2), (1, 1, 1, 1, 3, 3, 3, 3, 1, 2), (2, 2, 2, 2)]
prompts = st.tuples(
    st.sampled_from(SHARED_PREFIXES), st.lists(st.integers(1, 3), max_size=7)
).map(lambda t: list(t[0]) + t[1]).filter(bool)


class PagedCacheMachine(RuleBasedStateMachine):
    NUM_BLOCKS = 14  # not a multiple of SLAB: storage growth is clamped to the pool
    PREFIX_CACHING = True

    def __init__(self) -> None:
        super().__init__()
        n = self.NUM_BLOCKS
        self.storage = self.make_storage(n)
        self.cache = self.make_cache(self.storage, n)
        # --- the model ---
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}  # what each sequence wrote, position by position
        self.considered: dict[int, int] = {}  # full blocks already offered to the prefix cache
        self.ref = [0] * n
        self.fresh = set(range(n))
        self.lru: list[int] = []  # cache-only blocks, evict-first at the head
        self.cached: dict[int, tuple[int, ...]] = {}  # block -> the whole prefix it ends
        self.by_prefix: dict[tuple[int, ...], int] = {}
        self.hit_blocks = 0
        self.cows = 0
        self.high_water = 0
        self.next_id = 0

    # --- what is under test (a subclass may run another paged cache / storage) ----------
    def make_storage(self, num_blocks: int):
        """A KVStorage with ``copy_calls`` and ``bytes_per_block``, speaking numpy arrays."""
        return NumpyKVStorage(LAYERS, 1, 2, BS, slab_blocks=SLAB, max_blocks=num_blocks)

    def make_cache(self, storage, num_blocks: int):
        return PagedKVCache(storage, BS, num_blocks, prefix_caching=self.PREFIX_CACHING)

    # --- model helpers -----------------------------------------------------------------
    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _snapshot(self):
        pool = self.cache.pool
        return (
            {s: list(self.cache.block_table(s)) for s in self.tables},
            list(pool.ref_cnt),
            list(pool.block_hash),
            pool.evictable_blocks(),
            sorted(pool._fresh),
            self.cache.usage(),
            self.storage.nbytes(),
            self.storage.copy_calls,
        )

    def _model_release(self, seq: int) -> None:
        for b in reversed(self.tables.pop(seq)):
            self.ref[b] -= 1
            assert self.ref[b] >= 0
            if self.ref[b] == 0:
                if b in self.cached:
                    self.lru.append(b)
                else:
                    self.fresh.add(b)
        del self.tokens[seq]
        del self.considered[seq]

    def _release(self, seq: int) -> None:
        self.cache.free(seq)
        self._model_release(seq)
        assert list(self.cache.block_table(seq)) == []

    def _publish(self, seq: int) -> None:
        toks = self.tokens[seq]
        self.cache.publish(seq, list(toks), len(toks))
        full = len(toks) // BS
        for i in range(self.considered[seq], full):
            prefix = tuple(toks[:(i + 1) * BS])
            b = self.tables[seq][i]
            if self.PREFIX_CACHING and prefix not in self.by_prefix and b not in self.cached:
                self.cached[b] = prefix
                self.by_prefix[prefix] = b
        self.considered[seq] = max(self.considered[seq], full)

    def _extend(self, seq: int, new_tokens: list[int]) -> bool:
        """allocate_slots for the next len(new_tokens) positions, write them, publish."""
        table = self.tables[seq]
        start = len(self.tokens[seq])
        end = start + len(new_tokens)
        assert len(table) == cdiv(start, BS)
        shared = start % BS != 0 and self.ref[table[start // BS]] > 1  # partly filled + shared
        need = cdiv(end, BS) - len(table) + int(shared)
        if need > len(self.fresh) + len(self.lru):
            before = self._snapshot()
            assert self.cache.allocate_slots(seq, start, len(new_tokens)) is False
            assert self._snapshot() == before, "a failed allocate_slots changed state"
            return False
        from_fresh = sorted(self.fresh)[:need]  # fresh blocks go out lowest id first
        evicted = self.lru[:need - len(from_fresh)]  # then least recently released first
        expected = set(from_fresh) | set(evicted)

        assert self.cache.allocate_slots(seq, start, len(new_tokens)) is True
        got = list(self.cache.block_table(seq))
        assert len(got) == cdiv(end, BS)
        cow_index = start // BS if shared else None
        for i, b in enumerate(table):
            if i != cow_index:
                assert got[i] == b, f"block {i} of seq {seq} changed without copy-on-write"
        handed = got[len(table):] + ([got[cow_index]] if shared else [])
        assert sorted(handed) == sorted(expected), (
            f"allocation handed out {handed}, expected fresh {from_fresh} + LRU-evicted {evicted}"
        )
        # model update
        for b in from_fresh:
            self.fresh.remove(b)
        for b in evicted:
            self.lru.remove(b)
            del self.by_prefix[self.cached.pop(b)]
        for b in handed:
            assert self.ref[b] == 0
            self.ref[b] = 1
            self.high_water = max(self.high_water, b + 1)
        if shared:
            self.ref[table[cow_index]] -= 1
            assert self.ref[table[cow_index]] >= 1
            self.cows += 1
        self.tables[seq] = got

        write_tokens(self.cache, seq, start, new_tokens)
        self.tokens[seq].extend(new_tokens)
        self._publish(seq)
        return True

    # --- rules -------------------------------------------------------------------------
    @rule(prompt=prompts)
    def add_sequence(self, prompt):
        seq = self._new_id()
        # the model's prefix match: longest chain of cached full blocks, last token excluded
        hits = []
        for i in range((len(prompt) - 1) // BS):
            b = self.by_prefix.get(tuple(prompt[:(i + 1) * BS]))
            if b is None:
                break
            hits.append(b)
        reused = self.cache.match_prefix(seq, list(prompt))
        assert reused == len(hits) * BS
        assert reused < len(prompt)
        assert list(self.cache.block_table(seq)) == hits
        for b in hits:
            self.ref[b] += 1
            if b in self.lru:
                self.lru.remove(b)
        self.hit_blocks += len(hits)
        self.tables[seq] = list(hits)
        self.tokens[seq] = list(prompt[:reused])
        self.considered[seq] = len(hits)
        if not self._extend(seq, list(prompt[reused:])):
            self._release(seq)  # as the engine would: give the hits back, try again later

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), new_tokens=st.lists(st.integers(1, 3), min_size=1, max_size=5))
    def extend(self, data, new_tokens):
        seq = data.draw(st.sampled_from(sorted(self.tables)), label="seq")
        self._extend(seq, new_tokens)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def decode_one(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tables)), label="seq")
        self._extend(seq, [data.draw(st.integers(1, 3), label="token")])

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tables)), label="parent")
        child = self._new_id()
        self.cache.fork(parent, child)
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        self.considered[child] = self.considered[parent]
        for b in self.tables[child]:
            self.ref[b] += 1
        assert list(self.cache.block_table(child)) == self.tables[child]

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def release(self, data):
        self._release(data.draw(st.sampled_from(sorted(self.tables)), label="seq"))

    # --- invariants --------------------------------------------------------------------
    @invariant()
    def counts(self):
        u = self.cache.usage()
        n = self.NUM_BLOCKS
        assert u.total == n
        assert u.used + u.free == u.total
        assert u.free == len(self.fresh) == self.cache.pool.num_free
        assert u.used == n - len(self.fresh)
        assert u.cached == len(self.cached)
        assert u.prefix_hit_blocks == self.hit_blocks
        assert u.cow_copies == self.cows == self.storage.copy_calls
        if not self.PREFIX_CACHING:
            assert u.cached == 0 and self.hit_blocks == 0

    @invariant()
    def block_states(self):
        pool = self.cache.pool
        holders = [0] * self.NUM_BLOCKS
        for seq in self.tables:
            table = list(self.cache.block_table(seq))
            assert table == self.tables[seq]
            assert len(set(table)) == len(table)
            assert len(table) == cdiv(len(self.tokens[seq]), BS)
            for b in table:
                holders[b] += 1
        assert holders == self.ref
        assert list(pool.ref_cnt) == holders  # ref count == number of tables holding the block
        fresh = set(pool._fresh)
        assert len(fresh) == len(pool._fresh)
        assert fresh == self.fresh
        for b in range(self.NUM_BLOCKS):
            has_hash = pool.block_hash[b] is not None
            assert has_hash == (b in self.cached)
            if b in fresh:
                assert holders[b] == 0 and not has_hash, f"block {b} is fresh but held"
            elif holders[b] == 0:  # cache-only: ref 0 and a hash
                assert has_hash, f"block {b} is neither fresh, held, nor cached"
        assert pool.evictable_blocks() == self.lru  # exactly the ref-0 cached blocks, LRU order
        assert set(self.lru) == {b for b in self.cached if holders[b] == 0}
        assert pool.num_cached == len(self.cached)

    @invariant()
    def data(self):
        for seq, toks in self.tokens.items():
            assert_reads(self.cache, self.tables[seq], toks, what=f"seq {seq}")
        for b, prefix in self.cached.items():  # a cached block holds its prefix's last block
            first = len(prefix) - BS
            slots = np.arange(b * BS, (b + 1) * BS)
            for layer in range(LAYERS):
                k, v = self.cache.read(layer, slots)
                ek, ev = encode(layer, prefix[first:], range(first, len(prefix)))
                np.testing.assert_array_equal(k, ek)
                np.testing.assert_array_equal(v, ev)

    @invariant()
    def storage_follows_high_water(self):
        blocks = min(cdiv(self.high_water, SLAB) * SLAB, self.NUM_BLOCKS)
        assert self.storage.nbytes() == blocks * self.storage.bytes_per_block

    def teardown(self):
        for seq in list(self.tables):
            self._release(seq)
            self.counts()
            self.block_states()
        u = self.cache.usage()
        assert u.used == u.cached == len(self.cached)
        if not self.PREFIX_CACHING:
            assert u.used == 0 and u.free == u.total


class PagedCacheMachineNoPrefix(PagedCacheMachine):
    PREFIX_CACHING = False


_machine_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = _machine_settings
TestPagedCacheMachineNoPrefix = PagedCacheMachineNoPrefix.TestCase
TestPagedCacheMachineNoPrefix.settings = settings(_machine_settings, max_examples=25)


# ------------------------------------------------------------------------------------------
# Paged cache: unit tests
# ------------------------------------------------------------------------------------------
def make_paged(num_blocks: int = 16, prefix_caching: bool = True, slab: int = SLAB):
    storage = NumpyKVStorage(LAYERS, 1, 2, BS, slab_blocks=slab)
    return PagedKVCache(storage, BS, num_blocks, prefix_caching=prefix_caching), storage


def run_prompt(cache, seq: int, prompt) -> int:
    """Engine-style admission: prefix hits, allocate the rest, write, publish."""
    reused = cache.match_prefix(seq, list(prompt))
    assert cache.allocate_slots(seq, reused, len(prompt) - reused)
    write_tokens(cache, seq, reused, list(prompt[reused:]))
    cache.publish(seq, list(prompt), len(prompt))
    return reused


def test_match_prefix_never_covers_last_token():
    cache, _ = make_paged()
    two_blocks = [5, 6, 7, 8, 9, 10, 11, 12]
    assert run_prompt(cache, 1, two_blocks) == 0
    assert cache.usage().cached == 2
    # the same prompt again: only the first block may come from the cache
    assert cache.match_prefix(2, two_blocks) == BS
    assert len(cache.block_table(2)) == 1
    cache.free(2)
    # one token more: both full blocks can be served, the extra token is computed
    assert cache.match_prefix(3, two_blocks + [1]) == 2 * BS
    cache.free(3)
    # exactly one block, and a single token: nothing from the cache
    assert cache.match_prefix(4, two_blocks[:BS]) == 0
    assert cache.match_prefix(5, two_blocks[:1]) == 0
    assert cache.usage().prefix_hit_blocks == 3


def test_identical_prompt_shares_blocks_by_reference():
    cache, storage = make_paged()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    run_prompt(cache, 1, prompt)
    a = list(cache.block_table(1))
    used, nbytes = cache.usage().used, storage.nbytes()

    assert cache.match_prefix(2, prompt) == 2 * BS
    b = list(cache.block_table(2))
    assert b == a[:2]  # the same block ids, not copies
    assert [cache.pool.ref_cnt[x] for x in a] == [2, 2, 1]
    assert cache.usage().used == used and storage.nbytes() == nbytes
    assert storage.copy_calls == 0 and cache.usage().cow_copies == 0
    assert cache.usage().prefix_hit_blocks == 2

    assert cache.allocate_slots(2, 2 * BS, len(prompt) - 2 * BS)
    write_tokens(cache, 2, 2 * BS, prompt[2 * BS:])
    b = list(cache.block_table(2))
    assert b[:2] == a[:2] and b[2] not in a
    assert_reads(cache, b, prompt, what="second request")
    assert_reads(cache, a, prompt, what="first request")
    assert storage.copy_calls == 0 and cache.usage().cow_copies == 0

    cache.free(1)
    cache.free(2)
    assert [cache.pool.ref_cnt[x] for x in a] == [0, 0, 0]
    assert cache.usage().used == cache.usage().cached == 2


def test_lru_eviction_order():
    cache, _ = make_paged(num_blocks=6)
    prompts = {1: [1] * 8, 2: [2] * 8, 3: [3] * 8}  # two full, published blocks each
    for seq, p in prompts.items():
        run_prompt(cache, seq, p)
    tables = {seq: list(cache.block_table(seq)) for seq in prompts}
    assert cache.usage().free == 0 and cache.usage().cached == 6
    for seq in (1, 3, 2):
        cache.free(seq)
    # least recently released first, each sequence tail first
    order = [tables[1][1], tables[1][0], tables[3][1], tables[3][0], tables[2][1], tables[2][0]]
    assert cache.pool.evictable_blocks() == order
    assert cache.usage().used == 6 and cache.usage().free == 0

    # a prefix hit takes a block out of the LRU; releasing it puts it at the back
    assert cache.match_prefix(4, [3] * 5) == BS
    assert cache.pool.evictable_blocks() == [b for b in order if b != tables[3][0]]
    cache.free(4)
    order = [b for b in order if b != tables[3][0]] + [tables[3][0]]
    assert cache.pool.evictable_blocks() == order

    # a new 3-block sequence takes the three least recently released blocks
    assert cache.match_prefix(5, [9] * 12) == 0
    assert cache.allocate_slots(5, 0, 12)
    assert sorted(cache.block_table(5)) == sorted(order[:3])
    assert cache.pool.evictable_blocks() == order[3:]
    assert cache.usage().cached == 3
    # the evicted prefix of seq 1 is gone, seq 3's tail is gone (its head survives), seq 2 stays
    assert cache.match_prefix(6, [1] * 9) == 0
    assert cache.match_prefix(7, [3] * 9) == BS
    assert cache.match_prefix(8, [2] * 9) == 2 * BS


def _state(cache, storage, seqs):
    pool = cache.pool
    return (
        {s: list(cache.block_table(s)) for s in seqs},
        list(pool.ref_cnt),
        list(pool.block_hash),
        pool.evictable_blocks(),
        sorted(pool._fresh),
        cache.usage(),
        storage.nbytes(),
        storage.copy_calls,
    )


def test_allocate_failure_leaves_state_unchanged():
    cache, storage = make_paged(num_blocks=4)
    run_prompt(cache, 1, [1, 2, 3, 4, 5, 6])  # 2 blocks, first published
    run_prompt(cache, 2, [7, 7])  # 1 block
    before = _state(cache, storage, [1, 2, 3])
    assert cache.allocate_slots(1, 6, 7) is False  # needs 2 more blocks, 1 free
    assert cache.allocate_slots(3, 0, 9) is False  # a new sequence
    assert list(cache.block_table(3)) == []
    assert _state(cache, storage, [1, 2, 3]) == before

    # a copy-on-write that has no block to copy into fails cleanly too
    cache.fork(2, 4)
    assert cache.allocate_slots(1, 6, 3)  # takes the last free block
    assert cache.usage().free == 0
    before = _state(cache, storage, [1, 2, 4])
    assert cache.allocate_slots(2, 2, 1) is False  # block is shared and partly filled
    assert _state(cache, storage, [1, 2, 4]) == before
    assert cache.usage().cow_copies == 0

    # once room exists the copy happens, and the child still reads the parent's old data
    cache.free(1)
    assert cache.allocate_slots(2, 2, 1)
    assert cache.usage().cow_copies == 1 and storage.copy_calls == 1
    assert cache.block_table(2)[0] != cache.block_table(4)[0]
    write_tokens(cache, 2, 2, [8])
    assert_reads(cache, cache.block_table(2), [7, 7, 8])
    assert_reads(cache, cache.block_table(4), [7, 7])


def test_cow_copy_only_for_shared_partly_filled_block():
    cache, storage = make_paged(num_blocks=16)
    run_prompt(cache, 1, [1, 2, 3, 4, 5, 6])  # block 0 full, block 1 half full
    cache.fork(1, 2)
    t1 = list(cache.block_table(1))
    assert [cache.pool.ref_cnt[b] for b in t1] == [2, 2]
    # the child writes into the shared, partly filled block: it is copied first
    assert cache.allocate_slots(2, 6, 1)
    write_tokens(cache, 2, 6, [9])
    t2 = list(cache.block_table(2))
    assert t2[0] == t1[0] and t2[1] != t1[1]
    assert cache.usage().cow_copies == 1
    assert [cache.pool.ref_cnt[b] for b in t1] == [2, 1]
    # the parent's block is now private: no further copy
    assert cache.allocate_slots(1, 6, 1)
    write_tokens(cache, 1, 6, [8])
    assert list(cache.block_table(1)) == t1
    assert cache.usage().cow_copies == 1
    # writing past a full shared block needs a new block, not a copy
    assert cache.allocate_slots(1, 7, 2)
    write_tokens(cache, 1, 7, [8, 8])
    assert cache.usage().cow_copies == 1 == storage.copy_calls
    assert_reads(cache, cache.block_table(1), [1, 2, 3, 4, 5, 6, 8, 8, 8])
    assert_reads(cache, cache.block_table(2), [1, 2, 3, 4, 5, 6, 9])


def test_storage_grows_in_slabs():
    cache, storage = make_paged(num_blocks=64, slab=4)
    bpb = storage.bytes_per_block
    assert storage.nbytes() == 0  # nothing reserved for the whole pool up front
    assert cache.match_prefix(1, [1]) == 0
    assert cache.allocate_slots(1, 0, 1)
    assert storage.nbytes() == 4 * bpb
    assert cache.allocate_slots(1, 1, 4 * BS - 1)  # 4 blocks: still one slab
    assert storage.nbytes() == 4 * bpb and storage.grow_calls == 1
    assert cache.allocate_slots(1, 4 * BS, 1)  # the 5th block opens the 2nd slab
    assert storage.nbytes() == 8 * bpb
    cache.free(1)
    # freed blocks are reused (lowest first): no growth while the high-water mark holds
    for seq in (2, 3):
        assert cache.match_prefix(seq, [seq]) == 0
        assert cache.allocate_slots(seq, 0, 2 * BS)
    assert sorted(b for s in (2, 3) for b in cache.block_table(s)) == [0, 1, 2, 3]
    assert storage.nbytes() == 8 * bpb and storage.grow_calls == 2
    assert storage.nbytes() < 64 * bpb


# ------------------------------------------------------------------------------------------
# Naive cache
# ------------------------------------------------------------------------------------------
def make_naive(num_blocks: int = 12):
    storage = NumpyKVStorage(LAYERS, 1, 2, BS, slab_blocks=SLAB)
    return NaiveKVCache(storage, BS, num_blocks), storage


def test_naive_contiguous_first_fit_and_fragmentation():
    cache, storage = make_naive(12)
    assert cache.allocate_slots(0, 0, 10, expected_total=20)  # reserves 5 blocks up front
    assert list(cache.block_table(0)) == [0, 1, 2, 3, 4]
    assert cache.allocate_slots(1, 0, 9)  # 3 blocks
    assert list(cache.block_table(1)) == [5, 6, 7]
    assert cache.usage().used == 8 and cache.usage().free == 4
    # growth inside the reservation needs nothing new; beyond it fails
    assert cache.allocate_slots(0, 10, 10)
    assert cache.allocate_slots(0, 20, 1) is False
    assert cache.usage().used == 8

    # data round trip through the contiguous "block table"
    write_tokens(cache, 1, 0, [3] * 9)
    assert_reads(cache, cache.block_table(1), [3] * 9)

    cache.free(0)
    assert cache.usage().used == 3
    assert cache.allocate_slots(2, 0, 16)  # first fit: the hole at the start
    assert list(cache.block_table(2)) == [0, 1, 2, 3]
    assert cache.allocate_slots(3, 0, 12)  # the 1-block hole at 4 is too small
    assert list(cache.block_table(3)) == [8, 9, 10]
    assert cache.usage().used == 10
    # 2 blocks free (4 and 11) but no run of 2
    assert cache.usage().free == 2
    before = (cache.usage(), {s: list(cache.block_table(s)) for s in range(5)}, storage.nbytes())
    assert cache.allocate_slots(4, 0, 8) is False
    assert (cache.usage(), {s: list(cache.block_table(s)) for s in range(5)}, storage.nbytes()) == before
    assert list(cache.block_table(4)) == []
    assert cache.allocate_slots(4, 0, 4)  # one block fits in the first hole
    assert list(cache.block_table(4)) == [4]
    assert_reads(cache, cache.block_table(1), [3] * 9)  # neighbours' writes did not touch it
    for s in range(5):
        cache.free(s)
    assert cache.usage().used == 0 and cache.usage().free == 12 and cache.usage().cached == 0


def test_protocols():
    naive, storage = make_naive()
    paged, _ = make_paged()
    assert isinstance(storage, KVStorage)
    assert isinstance(naive, KVCache)
    assert not isinstance(naive, PrefixCaching)
    assert not isinstance(naive, Forking)
    assert isinstance(paged, KVCache)
    assert isinstance(paged, PrefixCaching)
    assert isinstance(paged, Forking)


# ------------------------------------------------------------------------------------------
# §7 check 5: paged KV without fragmentation
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check5_no_fragmentation(seed):
    bs, num_blocks = 16, 1024
    rng = random.Random(seed)
    storage = NumpyKVStorage(1, 1, 2, bs, slab_blocks=32)
    cache = PagedKVCache(storage, bs, num_blocks, prefix_caching=False)
    lengths = {seq: rng.randint(1, 512) for seq in range(32)}
    done = {seq: 0 for seq in lengths}

    def check():
        u = cache.usage()
        assert u.used + u.free == u.total == num_blocks
        assert u.used == sum(cdiv(n, bs) for n in done.values())
        assert u.cached == 0

    for seq in lengths:
        assert cache.match_prefix(seq, [1] * lengths[seq]) == 0
    # interleaved chunked prefill and decode, in random order
    while any(done[s] < lengths[s] for s in lengths):
        seq = rng.choice([s for s in lengths if done[s] < lengths[s]])
        n = min(rng.choice([1, 1, 7, 16, 33, 200]), lengths[seq] - done[seq])
        assert cache.allocate_slots(seq, done[seq], n)
        slots = slots_of(cache.block_table(seq), range(done[seq], done[seq] + n), bs)
        k, v = encode(0, [seq] * n, range(done[seq], done[seq] + n))
        cache.write(0, slots, k, v)
        done[seq] += n
        check()
    assert cache.usage().used == sum(cdiv(n, bs) for n in lengths.values())
    for seq, n in lengths.items():
        assert len(cache.block_table(seq)) == cdiv(n, bs)
        assert_reads(cache, cache.block_table(seq), [seq] * n, bs=bs, layers=1)
    for seq in rng.sample(list(lengths), len(lengths)):
        cache.free(seq)
        del done[seq]
        check()
    assert cache.usage().used == 0 and cache.usage().free == num_blocks


def test_check5_worst_case_fills_pool_exactly():
    cache = PagedKVCache(NumpyKVStorage(1, 1, 1, 16, slab_blocks=32), 16, 1024, prefix_caching=False)
    for seq in range(32):
        assert cache.allocate_slots(seq, 0, 512)
    assert cache.usage().used == 1024 and cache.usage().free == 0
    assert cache.allocate_slots(32, 0, 1) is False
    for seq in range(32):
        cache.free(seq)
    assert cache.usage().used == 0


# ------------------------------------------------------------------------------------------
# The engine's use of fork: n choices, preemption and aborts in a small pool
# ------------------------------------------------------------------------------------------
ENGINE_PROMPTS = [(5, 6, 7, 8) * 5, (5, 6, 7, 8) * 4 + (9, 10, 11), (12, 13) * 9, (14,) * 3]


@pytest.fixture(scope="module")
def engine_reference(qwen3_tiny):
    """Tokens of each (prompt, seed, max_tokens) run alone in a large pool, computed on demand."""
    from qwen_serve import LLM, SamplingParams

    llm = LLM(str(qwen3_tiny), prefix_cache=False)
    memo: dict = {}

    def expected(prompt, seed, max_tokens):
        key = (prompt, seed, max_tokens)
        if key not in memo:
            params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, ignore_eos=True)
            memo[key] = llm.generate([list(prompt)], params)[0].token_ids
        return memo[key]

    return expected


engine_requests = st.lists(st.tuples(st.sampled_from(range(len(ENGINE_PROMPTS))), st.integers(1, 3),
                                     st.integers(1, 12), st.one_of(st.none(), st.integers(0, 8))),
                           min_size=1, max_size=5)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=engine_requests, kv_blocks=st.integers(6, 10), prefix_cache=st.booleans())
def test_engine_forks_preempts_and_aborts_without_losing_a_block(qwen3_tiny, engine_reference, requests, kv_blocks,
                                                                 prefix_cache):
    """Requests of 1-3 choices (seed 100 + request, choice i draws from seed + i), some aborted
    after a few steps: at every step ref counts equal the block tables holding each block and
    used + free == total; at the end only prefix-cache blocks are used, and every choice that ran
    to the end produced exactly what it produces alone."""
    from qwen_serve import LLM, SamplingParams

    llm = LLM(str(qwen3_tiny), kv_blocks=kv_blocks, prefix_cache=prefix_cache, chunk_size=8, step_budget=16)
    engine, cache = llm.engine, llm.parts.cache
    aborts = {}
    for i, (prompt, n, max_tokens, abort_after) in enumerate(requests):
        params = SamplingParams(temperature=1.0, seed=100 + i, max_tokens=max_tokens, ignore_eos=True, n=n)
        engine.add_request(f"r{i}", list(ENGINE_PROMPTS[prompt]), params)
        if abort_after is not None:
            aborts.setdefault(abort_after, []).append(f"r{i}")
    choices = {f"r{i}": list(engine.sequences[f"r{i}"]) for i in range(len(requests))}
    def check() -> None:
        assert_blocks_accounted(cache)
        assert cache.usage().total == kv_blocks

    step_until_done(engine, aborts, check)
    usage = cache.usage()
    event(f"preempted: {engine.scheduler.num_preemptions > 0}")
    event(f"copied on write: {usage.cow_copies > 0}")
    event(f"aborted while running: {any(s.finish_reason == 'abort' for c in choices.values() for s in c)}")
    assert usage.used == usage.cached and cache.sequence_ids() == []
    if not prefix_cache:
        assert usage.used == 0
    for i, (prompt, n, max_tokens, _) in enumerate(requests):
        for seq in choices[f"r{i}"]:
            if seq.finish_reason != "abort":
                assert seq.output_token_ids == engine_reference(ENGINE_PROMPTS[prompt], 100 + i + seq.index, max_tokens)
