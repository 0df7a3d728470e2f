"""The engine's own request checks, run at the ingress, which holds no weights.

Engine.check_request reads three things of its engine: the model's geometry, the longest
sequence it serves, and whether its KV cache could ever fit the request. The ingress has all
three without loading weights: the checkpoint's config, the same EngineConfig the replicas are
built with, and the same KV-cache plugin over the backend's (lazily grown, here never grown)
storage. So a request the replicas would refuse is refused at the ingress by the same code,
before anything is sent to a replica or to the client.
"""
from __future__ import annotations

from ..config import EngineConfig, ModelConfig
from ..engine.engine import Engine
from ..protocols import KVCache
from ..registry import Registry
from .spec import ModelSpec


class IngressChecks:
    check_request = Engine.check_request  # the engine's code, reading only the three fields below

    def __init__(self, model_config: ModelConfig, config: EngineConfig, cache: KVCache) -> None:
        self.model_config = model_config
        self.config = config
        self.max_seq_len = config.resolved_max_seq_len(model_config)
        self.cache = cache

    @classmethod
    def build(cls, spec: ModelSpec, model_config: ModelConfig, registry: Registry) -> "IngressChecks":
        config = spec.engine_config
        storage = registry.backend(spec.backend).create_kv_storage(
            model_config, spec.dtype, config.block_size, config.slab_blocks, config.kv_blocks)
        return cls(model_config, config, registry.kv_cache_factory(spec.kv_cache)(storage, config))
