"""Qwen2 and Qwen2.5 (Qwen2ForCausalLM): the Llama decoder with biases on q, k and v."""
from __future__ import annotations

from typing import Any

from .architecture import Architecture
from .layers import Attention, DecoderLayer, DenseMLP


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(Attention(biased=("q_proj", "k_proj", "v_proj")), DenseMLP())


ARCHITECTURE = Architecture(hf_name="Qwen2ForCausalLM", decoder_layer=decoder_layer, gguf_name="qwen2")
