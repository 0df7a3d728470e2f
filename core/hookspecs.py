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
    """Call register(name, factory) for each KV cache; factory(storage, engine_config) -> KVCache."""


@hookspec
def register_logits_processors(register: Callable[..., None]) -> None:
    """Call register(name, factory) for each logits processor; factory(model_config, tokenizer) ->
    LogitsProcessor (core/protocols.py), built once per engine."""
