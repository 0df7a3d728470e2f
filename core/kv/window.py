"""Sliding-window attention, the core's side: which window an engine runs with, and which keys a
query may see. Backends build their masks from ``visible_keys`` so both mean the same window."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..config import EngineConfig
from ..models.config import ModelConfig
from ..protocols import SlidingWindow


def window_start(position: int, window: int) -> int:
    """The oldest position a query at `position` attends to (transformers: key > query - window)."""
    return max(0, position - window + 1)


def visible_keys(start: int, stop: int, first: int, window: int | None) -> np.ndarray:
    """[stop - start, stop - first] bool: may the query at position start + i attend to the key
    at position first + j (causal, and inside the window when there is one)."""
    queries = np.arange(start, stop)[:, None]
    keys = np.arange(first, stop)[None, :]
    visible = keys <= queries
    if window is not None:
        visible &= keys > queries - window
    return visible


def with_declared_window(model: ModelConfig, config: EngineConfig) -> EngineConfig:
    """A checkpoint whose every layer slides gives the engine its window unless one was chosen."""
    if model.sliding_window is not None and config.kv_window is None:
        return replace(config, kv_window=model.sliding_window)
    return config


def check_attention_window(model: ModelConfig, config: EngineConfig, cache: Any) -> None:
    """Refuse a cache that would attend over another span than the checkpoint (or --kv-window)
    asks for: the output would be silently wrong. A sliding cache on a full-attention checkpoint
    is allowed: that approximation is what the user chose with --kv-window."""
    name = type(cache).__name__
    slides = isinstance(cache, SlidingWindow)
    if model.sliding_window is not None and not slides:
        raise ValueError(f"{model.name} attends over a sliding window of {model.sliding_window} tokens in every "
                         f"layer, but the KV cache {name} keeps every position; use --kv-cache sliding-window")
    if model.sliding_window is not None and cache.window != model.sliding_window:
        raise ValueError(f"{model.name} declares a sliding window of {model.sliding_window} tokens, but the KV "
                         f"cache attends over {cache.window} tokens")
    if config.kv_window is not None and not slides:
        raise ValueError(f"--kv-window {config.kv_window} needs a sliding-window KV cache; {name} keeps every position")
