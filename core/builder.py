"""Assemble an engine from names: checkpoint path, backend, KV cache, dtype, quant."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .checkpoint import Checkpoint, load_checkpoint
from .config import EngineConfig, ModelConfig
from .default_model import default_model_path
from .engine import Engine
from .registry import Registry, load_registry
from .protocols import Backend, KVCache, ModelExecutor
from .tokenizer import Tokenizer


@dataclass
class EngineParts:
    engine: Engine
    backend: Backend
    executor: ModelExecutor
    cache: KVCache
    tokenizer: Tokenizer
    checkpoint: Checkpoint
    model_config: ModelConfig
    engine_config: EngineConfig
    registry: Registry


def build_engine(
    model: str | None,
    backend: str = "torch",
    kv_cache: str = "paged",
    dtype: str = "float32",
    quant: str = "none",
    env: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    **engine_options: Any,
) -> EngineParts:
    # Resolve every name before loading weights, so a typo fails in milliseconds.
    registry = registry or load_registry(env)
    config = EngineConfig(**engine_options)
    cache_factory = registry.kv_cache_factory(kv_cache)
    compute = registry.backend(backend)
    checkpoint = load_checkpoint(model if model is not None else default_model_path())
    executor = compute.load_model(checkpoint, dtype=dtype, quant=quant)
    storage = compute.create_kv_storage(checkpoint.config, dtype, config.block_size, config.slab_blocks, config.kv_blocks)
    cache = cache_factory(storage, config)
    engine = Engine(executor, cache, compute.create_sampler(), checkpoint.tokenizer, config)
    return EngineParts(engine, compute, executor, cache, checkpoint.tokenizer, checkpoint,
                       checkpoint.config, config, registry)
