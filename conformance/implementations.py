"""What the suite runs against: every installed backend x every KV cache, by registry name."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from qwen_serve import LLM
from qwen_serve.registry import Registry


@dataclass(frozen=True)
class Implementation:
    backend: str
    kv_cache: str

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.kv_cache}"


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
            pairs.append((Implementation(backend, cache), reason or cache_reason))
    return pairs


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
                      registry=self.registry, **options)
            while len(self._engines) >= self.keep:
                self._engines.popitem(last=False)
        self._engines[key] = llm
        return llm

    def clear(self) -> None:
        self._engines.clear()
