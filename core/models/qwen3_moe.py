"""Qwen3-MoE (Qwen3MoeForCausalLM, e.g. Qwen3-30B-A3B): Qwen3's attention, and a mixture of
experts in place of the dense MLP on the layers the config makes sparse."""
from __future__ import annotations

from typing import Any

from ..errors import ModelLoadError
from .architecture import Architecture, every_layer_windowed
from .layers import DecoderLayer, DenseMLP, SparseMoE
from .qwen3 import attention


def feed_forward(cfg: dict[str, Any], index: int, normalize: bool | None = None) -> DenseMLP | SparseMoE:
    """Layer `index` is sparse unless listed in mlp_only_layers, when it falls on every
    decoder_sparse_step-th layer (transformers' rule); the others keep a dense MLP of
    intermediate_size. normalize: whether the top_k weights are renormalized (None: as
    norm_topk_prob says). A shared_expert_intermediate_size adds a shared expert."""
    experts = cfg.get("num_experts", cfg.get("num_local_experts")) or 0  # transformers 5 writes num_local_experts
    step = cfg.get("decoder_sparse_step") or 1
    if experts == 0 or index in (cfg.get("mlp_only_layers") or ()) or (index + 1) % step:
        return DenseMLP()
    top_k, width = cfg.get("num_experts_per_tok"), cfg.get("moe_intermediate_size")
    if not isinstance(top_k, int) or not 1 <= top_k <= experts:
        raise ModelLoadError(f"config.json: num_experts_per_tok is {top_k!r}; it must be 1 to num_experts ({experts})")
    if not isinstance(width, int) or width < 1:
        raise ModelLoadError(f"config.json: moe_intermediate_size is {width!r}; it must be a positive integer")
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if not isinstance(shared, int) or shared < 0:
        raise ModelLoadError(f"config.json: shared_expert_intermediate_size is {shared!r}; it must be a whole number")
    return SparseMoE(num_experts=experts, top_k=top_k, intermediate_size=width,
                     normalize_top_k=bool(cfg.get("norm_topk_prob", False)) if normalize is None else normalize,
                     shared_expert_size=shared)


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(attention(cfg), feed_forward(cfg, index))


ARCHITECTURE = Architecture(hf_name="Qwen3MoeForCausalLM", decoder_layer=decoder_layer, gguf_name="qwen3moe",
                            window_layers=every_layer_windowed)
