"""The hooks a plugin implements. Each hands the plugin a ``register`` callback so one plugin
can contribute several backends or caches."""
from __future__ import annotations

from typing import Callable

import pluggy

PROJECT = "qwen_serve"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_backends(register: Callable[..., None]) -> None:
    """Call register(name, load, requires=(modules...), extra=None) for each compute backend."""


@hookspec
def register_kv_caches(register: Callable[..., None]) -> None:
    """Call register(name, factory, storage_format=None) for each KV cache; factory(storage,
    engine_config) -> KVCache. With a storage_format the cache gets that format's storage (see
    register_kv_storages) instead of the backend's own float storage."""


@hookspec
def register_kv_storages(register: Callable[..., None]) -> None:
    """Call register(storage_format, backend, create) for each KV storage format a plugin
    provides on a backend (e.g. "int8" on "torch"); create(model_config, block_size, slab_blocks,
    max_blocks) -> KVStorage."""


@hookspec
def register_logits_processors(register: Callable[..., None]) -> None:
    """Call register(name, factory) for each logits processor; factory(model_config, tokenizer) ->
    LogitsProcessor (core/protocols/logits.py), built once per engine."""


@hookspec
def register_proposers(register: Callable[..., None]) -> None:
    """Call register(name, factory) for each speculative-decoding proposer; factory(engine_config)
    -> Proposer (core/protocols/speculative.py), built once per engine (``--speculative NAME``)."""
