"""Qwen3 (Qwen3ForCausalLM): the Llama decoder with RMSNorm over each head's queries and keys."""
from __future__ import annotations

from typing import Any

from .architecture import Architecture
from .layers import Attention, DecoderLayer, DenseMLP


def attention(cfg: dict[str, Any]) -> Attention:
    biased = ("q_proj", "k_proj", "v_proj", "o_proj") if cfg.get("attention_bias") else ()
    return Attention(qk_norm=True, biased=biased)


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(attention(cfg), DenseMLP())


ARCHITECTURE = Architecture(hf_name="Qwen3ForCausalLM", decoder_layer=decoder_layer, gguf_name="qwen3")
