"""Check 5: 32 sequences of random length 1..512 use exactly sum(ceil(len/16)) blocks,
used + free == total throughout, and every block comes back after release.

A cache that reserves each sequence's longest possible length (ReservesAhead, e.g. naive), or one
that keeps only a window of each sequence (SlidingWindow), shows the difference on purpose: it
is xfailed with both figures, after the totals and the release of every block were checked."""
from __future__ import annotations

import random

import pytest

from qwen_serve.config import EngineConfig
from qwen_serve.models.config import ModelConfig

from .requirements import holds_only_a_window, reserves_ahead

pytestmark = pytest.mark.conformance_check(5)
POOL_BLOCKS = 1024
MAX_LEN = 512
GEOMETRY = ModelConfig(architecture="Qwen3ForCausalLM", vocab_size=1000, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6, rms_norm_eps=1e-6,
                       max_position_embeddings=MAX_LEN, tie_word_embeddings=True)


def test_block_accounting_is_exact(implementation, registry, figure):
    config = EngineConfig(kv_blocks=POOL_BLOCKS, prefix_cache=False, **implementation.engine_options())
    backend = registry.backend(implementation.backend)
    storage = registry.create_kv_storage(implementation.kv_cache, backend, GEOMETRY, "float32", config.block_size,
                                         config.slab_blocks, config.kv_blocks)
    cache = registry.kv_cache_factory(implementation.kv_cache)(storage, config)
    rng = random.Random(5)
    lengths = [rng.randint(1, MAX_LEN) for _ in range(32)]
    bs = config.block_size

    def check_totals() -> None:
        usage = cache.usage()
        assert usage.used + usage.free == usage.total == POOL_BLOCKS

    for seq_id, length in enumerate(lengths):
        # grow each sequence the way the engine does: the prompt, then some decoded tokens
        prompt = max(1, length - rng.randint(0, min(length - 1, 40)))
        assert cache.allocate_slots(seq_id, 0, prompt, expected_total=MAX_LEN)
        for position in range(prompt, length):
            assert cache.allocate_slots(seq_id, position, 1, expected_total=MAX_LEN)
        check_totals()
    exact = sum(-(-n // bs) for n in lengths)
    used = cache.usage().used
    for seq_id in rng.sample(range(len(lengths)), len(lengths)):
        cache.free(seq_id)
        check_totals()
    assert cache.usage().used == 0, "blocks leaked after every sequence was released"
    figure(f"used {used} blocks for sum(ceil(len/16)) = {exact}")
    reason = reserves_ahead(cache) or holds_only_a_window(cache)
    if reason:
        pytest.xfail(f"{reason}: {used} blocks used for {exact} needed")
    assert used == exact
