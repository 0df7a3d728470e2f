"""Registers the `sliding-window` KV cache. Its window comes from the engine options
(``--kv-window N`` / ``LLM(..., kv_window=N)``) or, for a checkpoint whose every layer slides,
from its config.json; a full-attention checkpoint on this cache attends over the last N
positions only, an approximation the user chose.

Written against qwen-serve's public API only: the hook marker, the BlockPool bookkeeping and the
SlidingWindow Protocol that both backends' executors honour.
"""
from __future__ import annotations

from qwen_serve.config import EngineConfig
from qwen_serve.hookspecs import hookimpl
from qwen_serve.protocols import KVStorage

from .cache import SlidingWindowKVCache


def make_sliding_window(storage: KVStorage, config: EngineConfig) -> SlidingWindowKVCache:
    if config.kv_window is None:
        raise ValueError("the sliding-window KV cache needs a window: pass --kv-window N (tokens), "
                         "or load a checkpoint that declares sliding_window")
    return SlidingWindowKVCache(storage, config.block_size, config.kv_blocks, config.kv_window, config.chunk_size)


@hookimpl
def register_kv_caches(register):
    register("sliding-window", make_sliding_window)
