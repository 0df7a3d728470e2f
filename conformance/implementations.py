"""What the suite runs against: every installed backend x every KV cache, by registry name."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pytest

from qwen_serve import LLM
from qwen_serve.config import EngineConfig
from qwen_serve.models.config import ModelConfig
from qwen_serve.registry import Registry

from .requirements import CONFORMANCE_WINDOW, cannot_serve, engine_options_for

# A tiny geometry to build a cache on before any model is loaded, to read what it implements.
PROBE_GEOMETRY = ModelConfig(architecture="Qwen3ForCausalLM", vocab_size=1000, hidden_size=64, intermediate_size=128,
                             num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6,
                             rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True)


@dataclass(frozen=True)
class Implementation:
    backend: str
    kv_cache: str
    options: tuple[tuple[str, Any], ...] = ()  # engine options the cache needs, e.g. its window

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.kv_cache}"

    def engine_options(self) -> dict[str, Any]:
        return dict(self.options)

    def cli_flags(self) -> list[str]:
        return [arg for name, value in self.options for arg in (f"--{name.replace('_', '-')}", str(value))]


def discover(registry: Registry, backends: list[str] | None, caches: list[str] | None) -> list[tuple[Implementation, str | None]]:
    """All pairs, each with the reason it cannot run here (None when it can)."""
    chosen_backends = backends or sorted(registry.backends)
    chosen_caches = caches or sorted(registry.kv_caches)
    pairs = []
    for backend in chosen_backends:
        reason = None
        entry = registry.backends.get(backend)
        if entry is None:
            reason = f"backend {backend!r} is not installed"
        elif entry.missing():
            hint = f" (pip install 'qwen-serve[{entry.extra}]')" if entry.extra else ""
            reason = f"backend {backend!r} needs {', '.join(entry.missing())}{hint}"
        for cache in chosen_caches:
            cache_reason = None if cache in registry.kv_caches else f"KV cache {cache!r} is not installed"
            options = probe_options(registry, backend, cache) if not (reason or cache_reason) else {}
            pairs.append((Implementation(backend, cache, tuple(sorted(options.items()))), reason or cache_reason))
    return pairs


def probe_options(registry: Registry, backend: str, kv_cache: str) -> dict[str, Any]:
    """The engine options a cache takes, read from the Protocols a probe instance implements."""
    return engine_options_for(probe_cache(registry, backend, kv_cache))


def probe_cache(registry: Registry, backend: str, kv_cache: str) -> Any:
    """The cache built on a tiny storage, offered every option it might need, so a check can read
    what it implements before loading a model."""
    config = EngineConfig(kv_blocks=4, kv_window=CONFORMANCE_WINDOW)
    compute = registry.backend(backend)
    storage = registry.create_kv_storage(kv_cache, compute, PROBE_GEOMETRY, "float32", config.block_size,
                                         config.slab_blocks, config.kv_blocks)
    return registry.kv_cache_factory(kv_cache)(storage, config)


def skip_unservable(registry: Registry, implementation: Implementation, model: str) -> None:
    """Skip, with the reason, a check on a model the pair cannot serve (requirements.cannot_serve)."""
    reason = cannot_serve(registry.backend(implementation.backend),
                          probe_cache(registry, implementation.backend, implementation.kv_cache), model)
    if reason:
        pytest.skip(reason)


class EngineCache:
    """Loaded engines reused across checks; only a few stay resident to bound memory."""

    def __init__(self, registry: Registry, keep: int = 2) -> None:
        self.registry = registry
        self.keep = keep
        self._engines: OrderedDict[tuple, LLM] = OrderedDict()

    def get(self, impl: Implementation, model: str, quant: str = "none", **options: Any) -> LLM:
        key = (impl, model, quant, tuple(sorted(options.items())))
        llm = self._engines.pop(key, None)
        if llm is None:
            llm = LLM(model, backend=impl.backend, kv_cache=impl.kv_cache, quant=quant,
                      registry=self.registry, **{**impl.engine_options(), **options})
            while len(self._engines) >= self.keep:
                self._engines.popitem(last=False)
        self._engines[key] = llm
        return llm

    def clear(self) -> None:
        self._engines.clear()
