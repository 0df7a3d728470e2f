"""Plugin discovery and selection by name, with one-line errors for what is not there."""
from __future__ import annotations

import subprocess
import sys

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.errors import PluginNotFound, PluginUnavailable
from qwen_serve.hookspecs import hookimpl
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.protocols import Forking, KVCache, PrefixCaching
from qwen_serve.registry import load_registry, make_plugin_manager


def test_builtins_are_registered_without_entry_points():
    registry = load_registry(env={"QWEN_SERVE_PLUGINS": ""})
    assert {"torch", "mlx"} <= set(registry.backends)
    assert {"paged", "naive", "paged-int8", "sliding-window"} <= set(registry.kv_caches)
    assert list(registry.logits_processors) == ["penalties", "logit_bias", "min_tokens", "structured_output",
                                                     "thinking_budget"]


def test_unknown_names_give_one_line_errors_naming_what_is_installed():
    registry = load_registry(env={})
    with pytest.raises(PluginNotFound) as exc:
        registry.backend("cuda")
    assert "\n" not in str(exc.value) and "torch" in str(exc.value)
    with pytest.raises(PluginNotFound) as exc:
        registry.kv_cache_factory("ring")
    assert "\n" not in str(exc.value) and "paged" in str(exc.value) and "naive" in str(exc.value)


def test_backend_with_missing_library_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlx" else real(name, *a))
    with pytest.raises(PluginUnavailable) as exc:
        load_registry(env={}).backend("mlx")
    assert "qwen-serve[mlx]" in str(exc.value) and "\n" not in str(exc.value)


class CountingPagedCache(PagedKVCache):
    """A third-party style cache: the paged cache, counting allocations."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = 0

    def allocate_slots(self, *args, **kwargs):
        self.allocations += 1
        return super().allocate_slots(*args, **kwargs)


class CountingCachePlugin:
    @staticmethod
    @hookimpl
    def register_kv_caches(register):
        register("counting", lambda storage, cfg: CountingPagedCache(storage, cfg.block_size, cfg.kv_blocks))


def test_a_registered_plugin_cache_runs_the_engine(qwen3_tiny):
    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    pm.register(CountingCachePlugin, name="counting-cache")
    try:
        registry = load_registry(pm=pm)
        llm = LLM(str(qwen3_tiny), kv_cache="counting", registry=registry)
        out = llm.generate(["Hello"], SamplingParams(max_tokens=5, ignore_eos=True))[0]
        assert len(out.token_ids) == 5
        assert llm.parts.cache.allocations >= 5
        cache = llm.parts.cache
        assert isinstance(cache, KVCache) and isinstance(cache, PrefixCaching) and isinstance(cache, Forking)
    finally:
        pm.unregister(name="counting-cache")


def test_duplicate_names_are_refused():
    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})

    class Clash:
        @staticmethod
        @hookimpl
        def register_kv_caches(register):
            register("paged", lambda storage, cfg: None)

    pm.register(Clash, name="clash")
    try:
        with pytest.raises(PluginNotFound, match="registered twice"):
            load_registry(pm=pm)
    finally:
        pm.unregister(name="clash")


def test_env_var_restricts_entry_point_plugins():
    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    names = {name for name, _ in pm.list_name_plugin()}
    assert names == {"torch", "mlx", "kv_caches", "logits_processors", "ngram", "mtp", "int8_kv", "sliding_window"}


@pytest.mark.parametrize("flags, needle", [
    (["--backend", "cuda"], "unknown backend 'cuda'"),
    (["--kv-cache", "ring"], "unknown KV cache 'ring'"),
    (["--speculative", "eagle"], "unknown proposer 'eagle'; installed proposers: mtp, ngram"),
    (["--draft-vocab", "4096"], "--draft-vocab narrows what a draft head guesses"),
    (["--model", "/no/such/model"], "no such file"),
    (["--reasoning-parser", "deepseek"], "unknown reasoning parser 'deepseek'; choose one of qwen3, none"),
    (["--tool-call-parser", "mistral"], "unknown tool-call parser 'mistral'"),
    (["--model", "Qwen/Qwen3-0.6B"], "downloading it from the Hugging Face hub failed"),  # offline here
])
def test_cli_errors_are_one_line_with_exit_code_2(flags, needle):
    proc = subprocess.run([sys.executable, "-m", "qwen_serve", *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr
