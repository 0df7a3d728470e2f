"""The sliding-window KV cache plugin (qwen_serve.plugins.sliding_window): the ring of blocks,
block accounting under random workloads, greedy equality with transformers' own sliding-window
Qwen3 past the window on both backends, memory that stays flat while the context grows, and how
a checkpoint's declared window and --kv-window pick (or refuse) a cache."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.kv.memory import blocks_spanned
from qwen_serve.models import model_config_from_hf
from qwen_serve.plugins.sliding_window.cache import SlidingWindowKVCache
from qwen_serve.protocols import Forking, KVCache, PrefixCaching, SlidingWindow
from qwen_serve.server.memory_plan import format_memory_plan

try:  # works whether or not tests/ is a package, and under --import-mode=importlib
    from .numpy_kv_storage import NumpyKVStorage
    from .test_block_accounting import encode, slots_of
except ImportError:
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from numpy_kv_storage import NumpyKVStorage
    from test_block_accounting import encode, slots_of

WINDOW = 24
# Four layers: a token's receptive field reaches 4 x 23 positions back, more than one prefill
# chunk, so a window that lost keys anywhere in a chunk changes the answer.
GEOMETRY = Qwen3Geometry(num_hidden_layers=4)


def make_cache(window: int, block_size: int = 4, num_blocks: int = 64, chunk_size: int = 8):
    storage = NumpyKVStorage(1, 1, 2, block_size, slab_blocks=4, max_blocks=num_blocks)
    return SlidingWindowKVCache(storage, block_size, num_blocks, window, chunk_size), storage


def write(cache, seq: int, start: int, tokens) -> None:
    slots = slots_of(cache.block_table(seq), range(start, start + len(tokens)), cache.block_size)
    k, v = encode(0, tokens, range(start, start + len(tokens)))
    cache.write(0, slots, k, v)


def read_window(cache, seq: int, position: int):
    """What a query at `position` sees: keys of positions window_start .. position."""
    positions = range(cache.window_start(position), position + 1)
    k, _ = cache.read(0, slots_of(cache.block_table(seq), positions, cache.block_size))
    return list(positions), k


# ------------------------------------------------------------------------------------------
# The ring
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [4, 16])
def test_capacity_8_and_12_writes_read_positions_4_to_11_in_order(block_size):
    cache, _ = make_cache(window=8, block_size=block_size, chunk_size=1)
    for p in range(12):
        assert cache.allocate_slots(1, p, 1)
        write(cache, 1, p, [7])
    positions, k = read_window(cache, 1, 11)
    assert positions == list(range(4, 12))
    np.testing.assert_array_equal(k, encode(0, [7] * 8, range(4, 12))[0])
    assert len(cache.held_blocks(1)) <= blocks_spanned(8, block_size)
    if block_size == 4:  # positions 0..3 left the window: their block is back in the pool
        assert cache.block_table(1)[0] < 0 and cache.usage().used == 2


def test_protocols():
    cache, _ = make_cache(8)
    assert isinstance(cache, KVCache) and isinstance(cache, SlidingWindow)
    assert not isinstance(cache, PrefixCaching) and not isinstance(cache, Forking)
    assert (cache.window, cache.window_start(3), cache.window_start(20)) == (8, 0, 13)


def test_long_prompt_is_laid_out_as_a_ring_then_shrinks_to_the_window():
    window, bs, chunk = 8, 4, 8
    cache, _ = make_cache(window, bs, num_blocks=64, chunk_size=chunk)
    prompt = [1, 2, 3] * 20  # 60 tokens = 15 blocks
    assert cache.allocate_slots(1, 0, len(prompt))  # admission reserves the whole prompt at once
    ring = blocks_spanned(window - 1 + chunk, bs)
    assert cache.usage().used == ring < 15
    for start in range(0, len(prompt), chunk):  # the prefill runs in chunks, as the scheduler does
        write(cache, 1, start, prompt[start:start + chunk])
        for q in range(start, min(start + chunk, len(prompt))):  # every query of the chunk sees its window
            positions, k = read_window(cache, 1, q)
            np.testing.assert_array_equal(k, encode(0, [prompt[p] for p in positions], positions)[0])
    assert cache.allocate_slots(1, len(prompt), 1)  # the first decode gives back what left the window
    assert cache.usage().used == len(cache.held_blocks(1)) <= blocks_spanned(window, bs)


def test_random_workloads_keep_windows_intact_and_the_pool_exact():
    """Several sequences, random prompt lengths, chunked prefills, decodes, a small pool that
    makes allocations fail: after every write each query's window (every query of a prefill
    chunk included) reads back what was written,
    a failed allocation changes nothing, blocks are never shared, and all come back."""
    rng = random.Random(3)
    for trial in range(20):
        window, bs, chunk = rng.choice([3, 8, 13]), rng.choice([2, 4]), rng.choice([1, 5, 8])
        pool = rng.randint(8, 30)
        cache, storage = make_cache(window, bs, pool, chunk)
        tokens: dict[int, list[int]] = {}
        for _ in range(150):
            seq = rng.randrange(5)
            if seq not in tokens and rng.random() < 0.5:
                prompt = [rng.randint(1, 9) for _ in range(rng.randint(1, 40))]
                before = (cache.usage(), dict(cache._tables), storage.nbytes())
                if not cache.allocate_slots(seq, 0, len(prompt)):
                    assert (cache.usage(), dict(cache._tables), storage.nbytes()) == before
                    continue
                for start in range(0, len(prompt), chunk):
                    write(cache, seq, start, prompt[start:start + chunk])
                    for q in range(start, min(start + chunk, len(prompt))):  # every query of the chunk
                        positions, k = read_window(cache, seq, q)
                        np.testing.assert_array_equal(k, encode(0, [prompt[p] for p in positions], positions)[0])
                tokens[seq] = prompt
            elif seq in tokens and rng.random() < 0.8:
                p = len(tokens[seq])
                before = (cache.usage(), dict(cache._tables))
                if not cache.allocate_slots(seq, p, 1):
                    assert (cache.usage(), dict(cache._tables)) == before
                    continue
                tokens[seq].append(rng.randint(1, 9))
                write(cache, seq, p, tokens[seq][-1:])
                assert len(cache.held_blocks(seq)) <= blocks_spanned(window, bs)
            elif seq in tokens:
                cache.free(seq)
                del tokens[seq]
            held = [b for s in tokens for b in cache.held_blocks(s)]
            assert len(held) == len(set(held)) == cache.usage().used, f"trial {trial}"
            assert cache.usage().used + cache.usage().free == pool
            for s, toks in tokens.items():
                positions, k = read_window(cache, s, len(toks) - 1)
                np.testing.assert_array_equal(k, encode(0, [toks[p] for p in positions], positions)[0])
        for s in list(tokens):
            cache.free(s)
        assert cache.usage().used == 0


# ------------------------------------------------------------------------------------------
# Greedy equality with transformers' sliding-window Qwen3, past the window
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def windowed_qwen3(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-window"), GEOMETRY, seed=11, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def full_qwen3(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-full"), GEOMETRY, seed=11)


@pytest.mark.parametrize("backend, chunk_size", [("torch", 8), ("torch", 64), ("mlx", 16)])
def test_greedy_equals_transformers_sliding_window_beyond_the_window(windowed_qwen3, full_qwen3, backend, chunk_size):
    if backend == "mlx":
        pytest.importorskip("qwen_serve.backends.mlx.mx")
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 50000) for _ in range(n)] for n in (5, WINDOW - 1, 3 * WINDOW + 5, 150)]
    new_tokens = 2 * WINDOW + 7  # every answer runs past the window
    llm = LLM(str(windowed_qwen3), backend=backend, kv_cache="sliding-window", chunk_size=chunk_size)
    assert llm.parts.cache.window == WINDOW  # taken from the checkpoint's config.json
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))  # batched
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(windowed_qwen3, prompt, new_tokens)
    # the window matters: transformers without it answers otherwise once the window binds
    long_prompt = prompts[2]
    assert hf_greedy(full_qwen3, long_prompt, new_tokens) != outs[2].token_ids
    assert llm.parts.cache.usage().used == 0


def test_memory_stays_flat_while_the_context_grows(full_qwen3):
    """A full-attention checkpoint on the window cache (the user's choice of --kv-window)."""
    window, bs = 32, 8
    llm = LLM(str(full_qwen3), kv_cache="sliding-window", kv_window=window, block_size=bs, chunk_size=16)
    engine = llm.engine
    seq = engine.add_request("long", list(range(1000, 1040)), SamplingParams(max_tokens=400, ignore_eos=True))
    used_while_decoding = []
    while not seq.is_finished:
        engine.step()
        if seq.output_token_ids:
            used_while_decoding.append(llm.parts.cache.usage().used)
    assert seq.num_tokens == 440 > 10 * window
    assert max(used_while_decoding) <= blocks_spanned(window, bs) == 5  # not 440 / 8 = 55
    assert llm.parts.storage.nbytes() <= 32 * bs * llm.parts.storage.bytes_per_token()  # one slab ever grown
    plan = format_memory_plan(llm.parts, "float32", "none")
    assert "window     32 tokens: a decoding sequence holds at most 5 blocks" in plan, plan


# ------------------------------------------------------------------------------------------
# Which window, which cache
# ------------------------------------------------------------------------------------------
def test_declared_windows_are_read_by_transformers_rule():
    base = dict(architectures=["Qwen3ForCausalLM"], vocab_size=10, hidden_size=8, intermediate_size=8,
                num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1)
    assert model_config_from_hf(dict(base, sliding_window=16)).sliding_window is None  # not used
    cfg = dict(base, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert model_config_from_hf(cfg).sliding_window == 16
    layer_types = dict(base, use_sliding_window=True, sliding_window=16, layer_types=["sliding_attention"] * 4)
    assert model_config_from_hf(layer_types).sliding_window == 16
    with pytest.raises(ValueError, match="hybrid attention is not supported: 2 of 4 layers"):
        model_config_from_hf(dict(base, use_sliding_window=True, sliding_window=16, max_window_layers=2))


def test_window_mismatches_are_refused(windowed_qwen3, full_qwen3):
    with pytest.raises(ValueError, match="use --kv-cache sliding-window"):
        LLM(str(windowed_qwen3), kv_cache="paged")
    with pytest.raises(ValueError, match="declares a sliding window of 24 tokens, but the KV cache attends over 8 tokens"):
        LLM(str(windowed_qwen3), kv_cache="sliding-window", kv_window=8)
    with pytest.raises(ValueError, match="needs a window"):
        LLM(str(full_qwen3), kv_cache="sliding-window")
    with pytest.raises(ValueError, match="--kv-window 8 needs a sliding-window KV cache"):
        LLM(str(full_qwen3), kv_cache="paged", kv_window=8)


def test_cli_refuses_a_full_cache_on_a_windowed_checkpoint_in_one_line(windowed_qwen3):
    proc = subprocess.run([sys.executable, "-m", "qwen_serve", "--model", str(windowed_qwen3), "--prompt", "hi"],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "sliding window of 24 tokens" in lines[0], proc.stderr
    config = json.loads((windowed_qwen3 / "config.json").read_text())
    assert config["use_sliding_window"] and config["sliding_window"] == WINDOW
