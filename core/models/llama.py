"""Llama (LlamaForCausalLM; SmolLM2 too): grouped-query attention and a SwiGLU MLP, optional biases."""
from __future__ import annotations

from typing import Any

from .architecture import Architecture
from .layers import Attention, DecoderLayer, DenseMLP


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    attention_bias = ("q_proj", "k_proj", "v_proj", "o_proj") if cfg.get("attention_bias") else ()
    mlp_bias = DenseMLP.projections if cfg.get("mlp_bias") else ()
    return DecoderLayer(Attention(biased=attention_bias), DenseMLP(biased=mlp_bias))


# llama.cpp's converter interleaves each head's two rotary halves in Llama's q/k rows
ARCHITECTURE = Architecture(hf_name="LlamaForCausalLM", decoder_layer=decoder_layer, gguf_name="llama",
                            gguf_rope_permuted=True)
