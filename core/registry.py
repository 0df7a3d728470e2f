"""Plugin discovery: built-ins by import path, third parties by entry point.

``QWEN_SERVE_PLUGINS`` (comma-separated entry-point names) restricts which third-party
plugins load; set it empty to load built-ins only. ``QWEN_SERVE_PLUGIN_MODULES`` (comma-separated
import paths) registers plugin modules that are not installed, as ``pytest -p`` does, so an
author can run the server or the conformance suite on a plugin under development. Each call to
``load_registry`` builds its own plugin manager, so tests never share or reload a global one.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pluggy

from . import hookspecs
from .errors import PluginNotFound, PluginUnavailable

ENV_VAR = "QWEN_SERVE_PLUGINS"
MODULES_ENV_VAR = "QWEN_SERVE_PLUGIN_MODULES"
BUILTIN_PLUGINS = {
    "torch": "qwen_serve.backends.torch_cpu.plugin",
    "mlx": "qwen_serve.backends.mlx.plugin",
    "kv_caches": "qwen_serve.kv.plugin",
    "logits_processors": "qwen_serve.logits.plugin",
    "ngram": "qwen_serve.plugins.ngram.plugin",
    "mtp": "qwen_serve.plugins.mtp.plugin",
    "int8_kv": "qwen_serve.plugins.int8_kv.plugin",
    "sliding_window": "qwen_serve.plugins.sliding_window.plugin",
}


@dataclass(frozen=True)
class BackendEntry:
    name: str
    load: Callable[[], Any]  # returns a Backend; imports the array library lazily
    requires: tuple[str, ...] = ()
    extra: str | None = None
    plugin: str = ""

    def missing(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


@dataclass(frozen=True)
class KVCacheEntry:
    name: str
    factory: Callable[..., Any]
    plugin: str = ""
    storage_format: str | None = None  # None: the backend's own float storage in the chosen dtype


@dataclass(frozen=True)
class KVStorageEntry:
    storage_format: str
    backend: str
    create: Callable[..., Any]  # (model_config, block_size, slab_blocks, max_blocks) -> KVStorage
    plugin: str = ""

    @property
    def name(self) -> str:
        return f"{self.storage_format} on {self.backend}"


@dataclass(frozen=True)
class LogitsProcessorEntry:
    name: str
    factory: Callable[..., Any]  # factory(model_config, tokenizer) -> LogitsProcessor
    plugin: str = ""


@dataclass(frozen=True)
class ProposerEntry:
    name: str
    factory: Callable[..., Any]  # factory(engine_config) -> Proposer
    plugin: str = ""


@dataclass
class Registry:
    """Everything the loaded plugins registered, by name."""

    backends: dict[str, BackendEntry] = field(default_factory=dict)
    kv_caches: dict[str, KVCacheEntry] = field(default_factory=dict)
    logits_processors: dict[str, LogitsProcessorEntry] = field(default_factory=dict)  # applied in this order
    kv_storages: dict[tuple[str, str], KVStorageEntry] = field(default_factory=dict)
    proposers: dict[str, ProposerEntry] = field(default_factory=dict)
    plugin_manager: pluggy.PluginManager | None = None

    def backend(self, name: str) -> Any:
        entry = self.backends.get(name)
        if entry is None:
            raise PluginNotFound(
                f"unknown backend {name!r}; installed backends: {self._installed_backends()}"
            )
        missing = entry.missing()
        if missing:
            hint = f"pip install 'qwen-serve[{entry.extra}]'" if entry.extra else f"pip install {' '.join(missing)}"
            raise PluginUnavailable(
                f"backend {name!r} needs {', '.join(missing)} which is not installed ({hint}); "
                f"installed backends: {self._installed_backends()}"
            )
        return entry.load()

    def kv_cache_factory(self, name: str) -> Callable[..., Any]:
        entry = self.kv_caches.get(name)
        if entry is None:
            raise PluginNotFound(
                f"unknown KV cache {name!r}; installed KV caches: {', '.join(sorted(self.kv_caches)) or 'none'}"
            )
        return entry.factory

    def proposer_factory(self, name: str) -> Callable[..., Any]:
        entry = self.proposers.get(name)
        if entry is None:
            raise PluginNotFound(
                f"unknown proposer {name!r}; installed proposers: {', '.join(sorted(self.proposers)) or 'none'}"
            )
        return entry.factory

    def kv_storage_entry(self, kv_cache: str, backend: str) -> KVStorageEntry | None:
        """What stores the named cache's keys/values on a backend: None for the backend's own
        storage, else the entry of the storage format the cache asked for."""
        self.kv_cache_factory(kv_cache)  # an unknown cache fails first, with its own message
        fmt = self.kv_caches[kv_cache].storage_format
        if fmt is None:
            return None
        entry = self.kv_storages.get((fmt, backend))
        if entry is None:
            offered = sorted(b for f, b in self.kv_storages if f == fmt)
            raise PluginUnavailable(
                f"KV cache {kv_cache!r} stores {fmt} keys/values, which no plugin provides on backend "
                f"{backend!r}; it is available on: {', '.join(offered) or 'none'}"
            )
        return entry

    def create_kv_storage(self, kv_cache: str, backend: Any, config: Any, dtype: str, block_size: int,
                          slab_blocks: int, max_blocks: int) -> Any:
        """The KVStorage the named cache is built on, for a loaded backend and a ModelConfig."""
        entry = self.kv_storage_entry(kv_cache, backend.name)
        if entry is None:
            return backend.create_kv_storage(config, dtype, block_size, slab_blocks, max_blocks)
        return entry.create(config, block_size, slab_blocks, max_blocks)

    def _installed_backends(self) -> str:
        names = [
            n if not e.missing() else f"{n} (needs {', '.join(e.missing())})"
            for n, e in sorted(self.backends.items())
        ]
        return ", ".join(names) or "none"


def make_plugin_manager(env: Mapping[str, str] | None = None) -> pluggy.PluginManager:
    """A fresh manager with built-ins registered, then the allowed entry-point plugins."""
    env = os.environ if env is None else env
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, module in BUILTIN_PLUGINS.items():
        pm.register(importlib.import_module(module), name=name)
    allowed = env.get(ENV_VAR)
    if allowed is None:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    else:
        for name in filter(None, (n.strip() for n in allowed.split(","))):
            if pm.get_plugin(name) is None:
                pm.load_setuptools_entrypoints(hookspecs.PROJECT, name=name)
    for module in filter(None, (m.strip() for m in env.get(MODULES_ENV_VAR, "").split(","))):
        if pm.get_plugin(module) is None:
            try:
                pm.register(importlib.import_module(module), name=module)
            except ImportError as exc:
                raise PluginNotFound(f"{MODULES_ENV_VAR}: cannot import plugin module {module!r} ({exc})") from None
    return pm


def load_registry(env: Mapping[str, str] | None = None, pm: pluggy.PluginManager | None = None) -> Registry:
    """Ask every plugin to register what it provides; later registrations must not collide."""
    pm = pm or make_plugin_manager(env)
    registry = Registry(plugin_manager=pm)

    for plugin_name, plugin in pm.list_name_plugin():
        def register_backend(name: str, load: Callable[[], Any], requires=(), extra=None, _p=plugin_name):
            _claim(registry.backends, name, "backend", _p)
            registry.backends[name] = BackendEntry(name, load, tuple(requires), extra, _p)

        def register_kv_cache(name: str, factory: Callable[..., Any], storage_format: str | None = None,
                              _p=plugin_name):
            _claim(registry.kv_caches, name, "KV cache", _p)
            registry.kv_caches[name] = KVCacheEntry(name, factory, _p, storage_format)

        def register_kv_storage(storage_format: str, backend: str, create: Callable[..., Any], _p=plugin_name):
            _claim(registry.kv_storages, (storage_format, backend), "KV storage", _p)
            registry.kv_storages[(storage_format, backend)] = KVStorageEntry(storage_format, backend, create, _p)

        def register_logits_processor(name: str, factory: Callable[..., Any], _p=plugin_name):
            _claim(registry.logits_processors, name, "logits processor", _p)
            registry.logits_processors[name] = LogitsProcessorEntry(name, factory, _p)

        def register_proposer(name: str, factory: Callable[..., Any], _p=plugin_name):
            _claim(registry.proposers, name, "proposer", _p)
            registry.proposers[name] = ProposerEntry(name, factory, _p)

        caller = pm.subset_hook_caller
        others = [p for p in pm.get_plugins() if p is not plugin]
        caller("register_backends", remove_plugins=others)(register=register_backend)
        caller("register_kv_caches", remove_plugins=others)(register=register_kv_cache)
        caller("register_logits_processors", remove_plugins=others)(register=register_logits_processor)
        caller("register_kv_storages", remove_plugins=others)(register=register_kv_storage)
        caller("register_proposers", remove_plugins=others)(register=register_proposer)
    return registry


def _claim(table: dict, name: str, kind: str, plugin: str) -> None:
    if name in table:
        raise PluginNotFound(
            f"{kind} {name!r} registered twice (by {table[name].plugin!r} and {plugin!r})"
        )
