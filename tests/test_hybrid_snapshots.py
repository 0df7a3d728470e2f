"""The hybrid cache's state snapshots: which it keeps when they outnumber their slots, so that a
long prompt still has resume points for a later prompt that shares only its beginning."""
from __future__ import annotations

import pytest
from numpy_kv_storage import NumpyKVStorage

from qwen_serve.backends.torch_cpu.state_storage import TorchStateStorage
from qwen_serve.kv.hybrid import with_recurrent_state
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.kv.snapshot_index import LANDMARK_TOKENS, SnapshotIndex
from qwen_serve.models.layers import GatedDeltaNet

BLOCK = 16
CHUNK = 512  # as the engine's default prefill chunk


def test_the_index_gives_up_the_least_recent_non_landmark_first():
    index = SnapshotIndex(capacity=6)
    for i, landmark in enumerate([True, False, False, True, False]):
        index.add(bytes([i]), slot=10 + i, landmark=landmark)
    assert index.use(bytes([1])) == 11  # now the most recent of the others
    assert [index.evict(for_landmark=False) for _ in range(3)] == [12, 14, 11]
    assert bytes([0]) in index and len(index) == 2
    assert index.evict(for_landmark=False) is None  # a landmark goes only for a landmark
    assert [index.evict(for_landmark=True) for _ in range(3)] == [10, 13, None]


def test_landmarks_go_first_once_they_hold_more_than_half_the_slots():
    index = SnapshotIndex(capacity=4)
    for i in range(3):
        index.add(bytes([i]), slot=i, landmark=True)
    index.add(b"x", slot=9, landmark=False)
    assert index.evict(for_landmark=False) == 0  # three landmarks of four slots: the oldest landmark goes
    assert index.evict(for_landmark=False) == 9  # two of four: the others go first again


def prefill(cache, seq_id: int, tokens: list[int]) -> int:
    """What the engine does for a prompt: its prefix hit, then chunk by chunk the slots, the
    snapshots the executor writes and the publishing of the computed blocks. -> the hit."""
    hit = cache.match_prefix(seq_id, tokens)
    for start in range(hit, len(tokens), CHUNK):
        stop = min(start + CHUNK, len(tokens))
        assert cache.allocate_slots(seq_id, start, stop - start)
        cache.snapshot_slots(seq_id, start, stop)
        cache.publish(seq_id, tokens, stop)
    return hit


@pytest.mark.parametrize("snapshot_slots", [8, 20])
def test_a_long_prompt_keeps_resume_points_for_one_sharing_only_its_beginning(snapshot_slots):
    """A 1,600-token prompt makes 100 snapshots for 8 or 20 slots; a later prompt sharing its first
    1,100 tokens resumes at the landmark below them (1,024), where least-recently-used alone would
    have kept only the first prompt's last boundaries and given it nothing. A prompt sharing all
    but its last few tokens still resumes at the last boundary."""
    kind = GatedDeltaNet(num_key_heads=1, num_value_heads=1, key_dim=4, value_dim=4, conv_kernel=4)
    paged = PagedKVCache(NumpyKVStorage(block_size=BLOCK), block_size=BLOCK, num_blocks=512)
    cache = with_recurrent_state(paged, TorchStateStorage([kind], max_slots=2 + snapshot_slots), live_slots=2,
                                 snapshot_slots=snapshot_slots)
    first = list(range(1000, 2600))
    assert prefill(cache, 1, first) == 0
    cache.free(1)
    assert cache.usage().state_snapshots == snapshot_slots
    close = first[:1590] + [7, 8, 9]
    assert prefill(cache, 2, close) == 1584
    cache.free(2)
    shares_the_beginning = first[:1100] + list(range(5000, 5100))
    assert prefill(cache, 3, shares_the_beginning) == 2 * LANDMARK_TOKENS
    cache.free(3)
    usage = cache.usage()
    assert usage.states_used == usage.state_snapshots <= snapshot_slots  # every live slot went back
