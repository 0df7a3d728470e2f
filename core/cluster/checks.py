"""The engine's own request checks at the ingress, which holds no weights.

The ingress builds a real Engine from the same parts the replicas' builder uses (the
checkpoint's config and tokenizer, the EngineConfig, the KV-cache plugin over the backend's
storage, the backend's sampler), but over an executor that has the model's geometry and no
weights. It never steps; its ``check_request`` is the engine's, so a request the replicas would
refuse is refused at the ingress by the same code, before anything is sent anywhere.
"""
from __future__ import annotations

from typing import Any

from ..checkpoints.checkpoint import Checkpoint
from ..engine.engine import Engine
from ..models.config import ModelConfig
from ..registry import Registry
from .spec import ModelSpec


class WeightlessExecutor:
    """A ModelExecutor with the model's geometry only."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    def weight_bytes(self) -> int:
        return 0

    def execute(self, batch: Any, cache: Any) -> Any:
        raise RuntimeError("the ingress holds no weights: requests run on the engine replicas")


def validation_engine(spec: ModelSpec, checkpoint: Checkpoint, registry: Registry) -> Engine:
    config = spec.engine_config
    compute = registry.backend(spec.backend)
    storage = compute.create_kv_storage(checkpoint.config, spec.dtype, config.block_size, config.slab_blocks,
                                        config.kv_blocks)  # grown only when written: never, here
    cache = registry.kv_cache_factory(spec.kv_cache)(storage, config)
    return Engine(WeightlessExecutor(checkpoint.config), cache, compute.create_sampler(), checkpoint.tokenizer, config)
