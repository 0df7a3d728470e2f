"""The built-in KV caches, registered through the same hook third-party caches use."""
from __future__ import annotations

from ..config import EngineConfig
from ..hookspecs import hookimpl
from ..protocols import KVStorage
from .naive import NaiveKVCache
from .paged import PagedKVCache


def make_paged(storage: KVStorage, config: EngineConfig) -> PagedKVCache:
    return PagedKVCache(storage, config.block_size, config.kv_blocks, prefix_caching=config.prefix_cache)


def make_naive(storage: KVStorage, config: EngineConfig) -> NaiveKVCache:
    return NaiveKVCache(storage, config.block_size, config.kv_blocks)


@hookimpl
def register_kv_caches(register):
    register("paged", make_paged)
    register("naive", make_naive)
