"""Architectures as data: one file per architecture says which config.json fields it reads, its
weights and its decoder layers as a sequence of layer kinds (layers.py); each backend implements
every layer kind once and builds any architecture from this description."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ModelLoadError
from . import llama, qwen2, qwen3, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next
from .architecture import Architecture, read_model_config
from .config import ModelConfig

ARCHITECTURES: dict[str, Architecture] = {a.hf_name: a for a in (
    qwen3.ARCHITECTURE, qwen3_moe.ARCHITECTURE, qwen3_5.ARCHITECTURE, qwen3_5.MULTIMODAL, qwen3_5_moe.ARCHITECTURE,
    qwen3_5_moe.MULTIMODAL, qwen3_next.ARCHITECTURE, qwen2.ARCHITECTURE, llama.ARCHITECTURE)}


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
    """config.json -> ModelConfig, read by the architecture it names. A bare decoder's name
    ("Qwen3Model": the layers without a head, as embedding models are saved) reads as its causal
    LM's and pools the last token, as vLLM takes such names."""
    arch = (cfg.get("architectures") or [""])[0]
    cfg = text_part(cfg)
    bare = arch.endswith("Model") and arch.removesuffix("Model") + "ForCausalLM" in ARCHITECTURES
    config = read_model_config(architecture_named(arch.removesuffix("Model") + "ForCausalLM" if bare else arch), cfg, name)
    matryoshka = cfg.get("matryoshka_dimensions")
    if matryoshka is not None or cfg.get("is_matryoshka"):
        config = dataclasses.replace(config, matryoshka_dimensions=tuple(int(d) for d in matryoshka or ()))
    return dataclasses.replace(config, pooling="last") if bare else config


def text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config.json keeps the decoder's fields under text_config (and some, such as
    tie_word_embeddings, beside it): those fields as one flat dict, the vision part left out."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg
    outer = {key: value for key, value in cfg.items() if key not in ("text_config", "vision_config")}
    return {**outer, **text, **{key: cfg[key] for key in ("tie_word_embeddings",) if key in cfg}}
