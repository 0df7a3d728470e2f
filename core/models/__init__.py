"""Architectures as data: one file per architecture says which config.json fields it reads, its
weights and its decoder layers as a sequence of layer kinds (layers.py); each backend implements
every layer kind once and builds any architecture from this description."""
from __future__ import annotations

from typing import Any

from ..errors import ModelLoadError
from . import llama, qwen2, qwen3, qwen3_moe
from .architecture import Architecture, read_model_config
from .config import ModelConfig

ARCHITECTURES: dict[str, Architecture] = {a.hf_name: a for a in (
    qwen3.ARCHITECTURE, qwen3_moe.ARCHITECTURE, qwen2.ARCHITECTURE, llama.ARCHITECTURE)}


def architecture_named(hf_name: str) -> Architecture:
    """The architecture of config.json's "architectures"[0]; ModelLoadError lists the supported ones."""
    if hf_name not in ARCHITECTURES:
        raise ModelLoadError(f"unsupported architecture {hf_name!r}; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[hf_name]


def architecture_for_gguf(gguf_name: str | None) -> Architecture:
    """The architecture of a GGUF file's general.architecture."""
    by_gguf = {a.gguf_name: a for a in ARCHITECTURES.values() if a.gguf_name}
    if gguf_name not in by_gguf:
        raise ModelLoadError(f"GGUF architecture {gguf_name!r} is not supported; supported: {', '.join(by_gguf)}")
    return by_gguf[gguf_name]


def model_config_from_hf(cfg: dict[str, Any], name: str = "model") -> ModelConfig:
    """config.json -> ModelConfig, read by the architecture it names."""
    archs = cfg.get("architectures") or [""]
    return read_model_config(architecture_named(archs[0]), cfg, name)
