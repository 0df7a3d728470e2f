"""The prefix-affinity ranking (qwen_serve.cluster.affinity), without Ray: which replica a
request's block hashes send it to, how the per-replica memory of routed blocks ages, and when
load wins over affinity. Hashes are the engine's own (qwen_serve.kv.block_hash)."""
from __future__ import annotations

import random

import pytest

from qwen_serve.cluster.affinity import AffinityPolicy, PrefixIndex
from qwen_serve.kv.block_hash import chain_hashes

BS = 16


def hashes(tokens: list[int]) -> list[bytes]:
    return chain_hashes(tokens, BS, len(tokens) // BS)


def prompt(system: int, user: int, system_blocks: int = 4) -> list[int]:
    """A prompt of ``system_blocks`` blocks shared by every prompt of the same system, then one
    block of its own."""
    return [1000 + system] * (BS * system_blocks) + [user] * BS


def test_leading_matches_stop_at_the_first_gap():
    index = PrefixIndex(capacity_blocks=100)
    a = hashes(prompt(1, 1))
    index.touch(a)
    assert index.leading_matches(a) == 5
    assert index.leading_matches(hashes(prompt(1, 2))) == 4  # same system, other user block
    assert index.leading_matches(hashes(prompt(2, 1))) == 0
    # Chained hashes: the same last block after another system prompt is another hash.
    assert hashes(prompt(2, 1))[-1] not in index


def test_eviction_takes_the_least_recent_prompt_and_a_prompts_tail_first():
    index = PrefixIndex(capacity_blocks=8)
    old, new = hashes(prompt(1, 1)), hashes(prompt(2, 2))  # 5 blocks each
    index.touch(old)
    index.touch(new)
    assert len(index) == 8
    # Two blocks of `old` went, its tail first: its head still matches.
    assert index.leading_matches(old) == 3 and index.leading_matches(new) == 5
    index.resize(3)
    assert index.leading_matches(new) == 3 and index.leading_matches(old) == 0


def test_touching_again_makes_a_prompt_young():
    index = PrefixIndex(capacity_blocks=10)
    a, b, c = (hashes(prompt(s, s)) for s in (1, 2, 3))
    index.touch(a)
    index.touch(b)
    index.touch(a)  # a used again: b is now the oldest
    index.touch(c)
    assert index.leading_matches(a) == 5 and index.leading_matches(c) == 5 and index.leading_matches(b) == 0


def test_a_request_goes_where_its_prefix_is_and_new_prefixes_spread():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=4)
    idle = {"r0": 0, "r1": 0}
    first = policy.rank(hashes(prompt(1, 1)), idle)
    assert first == [["r0", "r1"]]  # nothing held anywhere: every replica holding the fewest blocks
    policy.routed("r0", hashes(prompt(1, 1)))
    # A second system prompt goes to the replica that holds nothing, even when busier.
    assert policy.rank(hashes(prompt(2, 1)), {"r0": 0, "r1": 2})[0] == ["r1"]
    policy.routed("r1", hashes(prompt(2, 1)))
    # The same system prompt with another user message follows its prefix, despite the load.
    assert policy.rank(hashes(prompt(1, 7)), {"r0": 3, "r1": 0}) == [["r0"], ["r1"]]
    assert policy.rank(hashes(prompt(2, 7)), {"r0": 0, "r1": 3}) == [["r1"], ["r0"]]


def test_longest_leading_run_wins():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=4)
    long = prompt(1, 1, system_blocks=6)
    policy.routed("a", hashes(long[: BS * 2]))  # holds the first 2 blocks
    policy.routed("b", hashes(long[: BS * 5]))  # holds the first 5
    assert policy.rank(hashes(long), {"a": 0, "b": 1})[0] == ["b"]


def test_imbalance_past_the_threshold_sends_to_the_least_loaded():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=4)
    policy.routed("r0", hashes(prompt(1, 1)))
    assert policy.rank(hashes(prompt(1, 2)), {"r0": 4, "r1": 0})[0] == ["r0"]  # difference 4: not past it
    assert policy.rank(hashes(prompt(1, 2)), {"r0": 5, "r1": 0}) == [["r1"], ["r0"]]


def test_ties_keep_every_equal_replica_in_the_first_rank_least_loaded_first():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=8)
    for replica in ("a", "b", "c"):
        policy.routed(replica, hashes(prompt(1, 1)))
    assert policy.rank(hashes(prompt(1, 2)), {"a": 2, "b": 1, "c": 3}) == [["b", "a", "c"]]


def test_replicas_that_leave_are_forgotten_and_replacements_start_empty():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=4)
    policy.routed("old", hashes(prompt(1, 1)))
    policy.sync_replicas(["new", "other"])
    assert "old" not in policy.indexes
    assert {r: len(i) for r, i in policy.indexes.items()} == {"new": 0, "other": 0}
    policy.routed("other", hashes(prompt(2, 1)))
    policy.forget("other")
    assert policy.rank(hashes(prompt(2, 1)), {"new": 0, "other": 0})[0] == ["new", "other"]


def test_reported_capacity_bounds_what_a_replica_is_believed_to_hold():
    policy: AffinityPolicy[str] = AffinityPolicy(capacity_blocks=100, imbalance_threshold=4)
    policy.routed("r", hashes(prompt(1, 1)))
    policy.set_capacity("r", 2)
    assert len(policy.indexes["r"]) == 2
    policy.set_capacity("r", 0)  # a report without the figure changes nothing
    assert policy.indexes["r"].capacity_blocks == 2


def test_no_candidates_and_bad_settings():
    assert AffinityPolicy(capacity_blocks=10, imbalance_threshold=1).rank(hashes(prompt(1, 1)), {}) == []
    with pytest.raises(ValueError):
        PrefixIndex(0)
    with pytest.raises(ValueError):
        AffinityPolicy(capacity_blocks=10, imbalance_threshold=-1)


def simulate(route, requests: list[tuple[int, int]], pool_blocks: int, system_blocks: int) -> float:
    """Cached blocks / prompt blocks of a sequential workload, each replica an LRU prefix cache
    of ``pool_blocks`` (the engine's chained matching: a hit is the leading run of held blocks)."""
    caches = [PrefixIndex(pool_blocks), PrefixIndex(pool_blocks)]
    cached = total = 0
    for system, user in requests:
        h = hashes(prompt(system, user, system_blocks))
        replica = route(h)
        cached += caches[replica].leading_matches(h[:-1])  # the last block is always computed
        total += len(h)
        caches[replica].touch(h)
    return cached / total


def test_affinity_beats_round_robin_on_the_workload_the_ray_test_measures():
    """The arithmetic behind tests/test_ray_cluster.py's margin, without Ray or a model: 4 system
    prompts x 6 requests, shuffled, 2 replicas whose pools hold about two system prompts each.
    Affinity splits the prompts 2 and 2 (each misses once); round robin sends every prompt to
    both replicas, where four prompts fight over room for two."""
    rng = random.Random(0)
    requests = [(s, u) for s in range(4) for u in range(6)]
    rng.shuffle(requests)
    policy: AffinityPolicy[int] = AffinityPolicy(capacity_blocks=70, imbalance_threshold=8)

    def affinity(h: list[bytes]) -> int:
        choice = policy.rank(h, {0: 0, 1: 0})[0][0]
        policy.routed(choice, h)
        return choice

    turn = iter(range(10**6))
    with_affinity = simulate(affinity, requests, pool_blocks=70, system_blocks=31)
    round_robin = simulate(lambda h: next(turn) % 2, requests, pool_blocks=70, system_blocks=31)
    assert with_affinity == pytest.approx(20 / 24 * 31 / 32)  # 4 misses of 24; a hit reuses 31 of 32 blocks
    assert with_affinity - round_robin > 0.2, (with_affinity, round_robin)
