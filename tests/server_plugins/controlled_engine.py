"""A test-only plugin whose behaviour the test switches with files in $QWEN_SERVE_TEST_CONTROL,
so lifecycle tests drive real server code paths without patching the server:

- backend "controlled" (torch underneath): while the file ``hold-load`` exists, loading the
  model waits (the server stays "loading"); ``step-delay`` holds seconds each model call
  sleeps first (a slow engine whose request lengths a test can bound from below);
- KV cache "controlled" (the paged cache): once the file ``fatal`` exists, reserving slots
  raises FatalEngineError, which kills the engine thread.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from qwen_serve.errors import FatalEngineError
from qwen_serve.hookspecs import hookimpl
from qwen_serve.kv.paged import PagedKVCache

ENV_VAR = "QWEN_SERVE_TEST_CONTROL"


def _control(name: str) -> Path:
    return Path(os.environ[ENV_VAR]) / name


class ControlledExecutor:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.config = inner.config

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()

    def execute(self, batch: Any, cache: Any) -> Any:
        delay = _control("step-delay")
        if delay.exists():
            time.sleep(float(delay.read_text()))
        return self.inner.execute(batch, cache)


class ControlledBackend:
    name = "controlled"

    def __init__(self) -> None:
        from qwen_serve.backends.torch_cpu.backend import TorchBackend

        self.inner = TorchBackend()
        self.quantizations = self.inner.quantizations

    def load_model(self, checkpoint: Any, dtype: str, quant: str, **kwargs: Any) -> ControlledExecutor:
        while _control("hold-load").exists():
            time.sleep(0.05)
        return ControlledExecutor(self.inner.load_model(checkpoint, dtype=dtype, quant=quant, **kwargs))

    def create_kv_storage(self, *args: Any) -> Any:
        return self.inner.create_kv_storage(*args)

    def create_sampler(self) -> Any:
        return self.inner.create_sampler()


class FatalOnDemandKVCache(PagedKVCache):
    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        if _control("fatal").exists():
            raise FatalEngineError("the test switched on a fatal KV cache error")
        return super().allocate_slots(seq_id, start, num_tokens, expected_total)


@hookimpl
def register_backends(register):
    register("controlled", ControlledBackend, requires=("torch",))


@hookimpl
def register_kv_caches(register):
    register("controlled", lambda storage, config: FatalOnDemandKVCache(
        storage, config.block_size, config.kv_blocks, prefix_caching=config.prefix_cache))
