"""Qwen3-Next (Qwen3NextForCausalLM, e.g. Qwen3-Next-80B-A3B): the blocks of Qwen3.5 (qwen3_5.py)
with Qwen3-MoE's placement of sparse layers and a shared expert in each. Its linear-attention
layers store their input projections grouped by key head, [q k v z] and [b a] per group; read
here into Qwen3.5's four tensors, so one layer kind serves both. Its multi-token-prediction head
(mtp.*) is laid out as Qwen3.5's."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .architecture import Architecture
from .config import ModelConfig
from .layers import DecoderLayer, GatedDeltaNet
from .qwen3_5 import draft_layer_of, mixer, take_rows, text_tensors
from .qwen3_5_gguf import LAYER_NAMES as QWEN3_5_GGUF_LAYER_NAMES
from .qwen3_5_gguf import gguf_config, undo
from .qwen3_moe import feed_forward


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(mixer(cfg, index), feed_forward(cfg, index))


draft_layer = draft_layer_of(decoder_layer)  # a mixture of experts in the published checkpoints


def grouped_rows(kind: GatedDeltaNet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of in_proj_qkvz that make in_proj_qkv (all queries, all keys, all values, value head
    g * r + j being the j-th of key group g) and in_proj_z; rows of in_proj_ba that make in_proj_b
    and in_proj_a."""
    k, r = kind.num_key_heads, kind.num_value_heads // kind.num_key_heads
    qk, v = kind.key_dim, r * kind.value_dim
    group = np.arange(k)[:, None] * (2 * qk + 2 * v)
    queries, keys = group + np.arange(qk), group + qk + np.arange(qk)
    values, z = group + 2 * qk + np.arange(v), group + 2 * qk + v + np.arange(v)
    pair = np.arange(k)[:, None] * 2 * r
    b, a = pair + np.arange(r), pair + r + np.arange(r)
    return np.concatenate([queries.ravel(), keys.ravel(), values.ravel()]), z.ravel(), b.ravel(), a.ravel()


def next_tensors(name: str, array: Any, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    if name.endswith((".in_proj_qkvz.weight", ".in_proj_ba.weight")):
        layer = int(name.split(".layers.", 1)[1].split(".", 1)[0])
        qkv, z, b, a = grouped_rows(config.layers[layer].mixer)
        prefix = name.rsplit(".", 2)[0]
        if name.endswith("qkvz.weight"):
            yield f"{prefix}.in_proj_qkv.weight", take_rows(array, qkv)
            yield f"{prefix}.in_proj_z.weight", take_rows(array, z)
        else:
            yield f"{prefix}.in_proj_b.weight", take_rows(array, b)
            yield f"{prefix}.in_proj_a.weight", take_rows(array, a)
        return
    yield from text_tensors(name, array, config)


GGUF_LAYER_NAMES = {**QWEN3_5_GGUF_LAYER_NAMES, "ssm_ba": "linear_attn.in_proj_ba"}  # [b a] per group, whole
ARCHITECTURE = Architecture(hf_name="Qwen3NextForCausalLM", decoder_layer=decoder_layer, tensors=next_tensors,
                            norm_offset=1.0, draft_layer=draft_layer, gguf_name="qwen3next", gguf_config=gguf_config,
                            gguf_layer_names=tuple(GGUF_LAYER_NAMES.items()),
                            gguf_undo=lambda name, config: undo(name, config, tiled=False))
