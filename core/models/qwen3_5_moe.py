"""Qwen3.5-MoE (Qwen3_5MoeForCausalLM, and the text part of Qwen3_5MoeForConditionalGeneration,
e.g. Qwen3.5-35B-A3B): Qwen3.5's layers (qwen3_5.py) with a mixture of experts and a shared expert
in place of every dense MLP; the router always renormalizes its top_k weights."""
from __future__ import annotations

from typing import Any

from .architecture import Architecture
from .layers import DecoderLayer
from .qwen3_5 import draft_layer_of, mixer, text_tensors
from .qwen3_5_gguf import LAYER_NAMES as GGUF_LAYER_NAMES
from .qwen3_5_gguf import gguf_config, undo
from .qwen3_moe import feed_forward


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(mixer(cfg, index), feed_forward(cfg, index, normalize=True))


draft_layer = draft_layer_of(decoder_layer)  # a mixture of experts like every layer's


ARCHITECTURE = Architecture(hf_name="Qwen3_5MoeForCausalLM", decoder_layer=decoder_layer, tensors=text_tensors,
                            norm_offset=1.0, draft_layer=draft_layer, gguf_name="qwen35moe", gguf_config=gguf_config,
                            gguf_layer_names=tuple(GGUF_LAYER_NAMES.items()), gguf_undo=undo)
MULTIMODAL = Architecture(hf_name="Qwen3_5MoeForConditionalGeneration", decoder_layer=decoder_layer,
                          tensors=text_tensors, norm_offset=1.0, draft_layer=draft_layer)
