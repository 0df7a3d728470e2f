"""Qwen3.5 as llama.cpp's converter writes it (GGUF `qwen35`, `qwen35moe`; Qwen3-Next's
`qwen3next` too): its metadata under config.json's keys, its tensor names, and the changes it
made to the values undone, so the file reads as the checkpoint it came from.

What the converter changes: the Gated DeltaNet decay is stored as ``-exp(A_log)``, the
convolution's singleton dimension is squeezed out, every zero-centred RMSNorm scale is stored
with 1 added (the linear-attention output norm is not zero-centred), and where a layer has more
value heads than key heads, the value heads are reordered from grouped by key head
(k0v0 k0v1 k1v0 k1v1) to tiled (k0v0 k1v0 k0v1 k1v1) in every tensor with a value-head axis.
Qwen3-Next's file keeps them grouped, and its [q k v z] projection split into Qwen3.5's qkv and z
(its [b a] one stays whole). The multi-token-prediction layers follow the decoder's blocks as
llama.cpp stores any architecture's (checkpoints/gguf.py reads them)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

LAYER_NAMES = {  # GGUF's names inside a block -> transformers' (a stem takes .weight / .bias after it)
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_out": "linear_attn.out_proj",
    "ssm_norm": "linear_attn.norm",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_a": "linear_attn.A_log",  # a whole name: neither has .weight
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}


# RMSNorm scales stored zero-centred, to which the converter added 1 (the draft head's two input
# norms too: it renames them enorm and hnorm first)
ZERO_CENTRED = ("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


def gguf_config(field: Callable[[str], Any], config: dict[str, Any]) -> dict[str, Any]:
    """config.json's keys that differ from the shared reading: each layer's mixer, the
    linear-attention geometry, the rotary fraction and the shared expert's width."""
    value_heads = field("ssm.time_step_rank")
    return {
        "layer_types": ["linear_attention" if r else "full_attention"
                        for r in field("attention.recurrent_layers")[:config["num_hidden_layers"]]],
        "linear_num_key_heads": field("ssm.group_count"),
        "linear_num_value_heads": value_heads,
        "linear_key_head_dim": field("ssm.state_size"),
        "linear_value_head_dim": field("ssm.inner_size") // value_heads,
        "linear_conv_kernel_dim": field("ssm.conv_kernel"),
        "partial_rotary_factor": field("rope.dimension_count") / config["head_dim"],
        "shared_expert_intermediate_size": field("expert_shared_feed_forward_length"),
    }


def undo(hf_name: str, config: dict[str, Any], tiled: bool = True) -> Callable[[np.ndarray], np.ndarray] | None:
    """The inverse of what the converter did to this tensor's values, if anything. tiled: whether
    it tiles the value heads (Qwen3.5's families; not Qwen3-Next, whose file keeps them grouped)."""
    heads = ValueHeads.of(config, tiled)
    if hf_name.endswith(ZERO_CENTRED) and not hf_name.endswith("linear_attn.norm.weight"):
        return lambda a: a - np.float32(1.0)
    if hf_name.endswith("linear_attn.A_log"):
        return lambda a: np.log(-heads.grouped(a, 0, 1))
    if hf_name.endswith("linear_attn.conv1d.weight"):
        return lambda a: heads.grouped_after(a, heads.query_key_rows, 0)[:, None, :]
    if not heads.tiled:
        return None
    if hf_name.endswith("linear_attn.dt_bias"):
        return lambda a: heads.grouped(a, 0, 1)
    if hf_name.endswith("linear_attn.in_proj_qkv.weight"):
        return lambda a: heads.grouped_after(a, heads.query_key_rows, 0)
    if hf_name.endswith("linear_attn.in_proj_z.weight"):
        return lambda a: heads.grouped(a, 0, heads.value_dim)
    if hf_name.endswith(("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight")):
        return lambda a: heads.grouped(a, 0, 1)
    if hf_name.endswith("linear_attn.out_proj.weight"):
        return lambda a: heads.grouped(a, 1, heads.value_dim)
    return None


class ValueHeads:
    """The linear-attention value heads' order in a converted file."""

    def __init__(self, key_heads: int, value_heads: int, key_dim: int, value_dim: int, tiled: bool) -> None:
        self.key_heads, self.per_key = key_heads, value_heads // key_heads
        self.value_dim = value_dim
        self.query_key_rows = 2 * key_heads * key_dim  # q and k before v in in_proj_qkv and the convolution
        self.tiled = tiled and self.per_key > 1  # one value head a key head: tiled and grouped are one order

    @classmethod
    def of(cls, config: dict[str, Any], tiled: bool) -> "ValueHeads":
        return cls(config["linear_num_key_heads"], config["linear_num_value_heads"], config["linear_key_head_dim"],
                   config["linear_value_head_dim"], tiled)

    def grouped(self, array: np.ndarray, axis: int, head_dim: int) -> np.ndarray:
        """array's axis, value heads of head_dim each in tiled order, in grouped order."""
        if not self.tiled:
            return array
        moved = np.moveaxis(array, axis, 0)
        rest = moved.shape[1:]
        tiles = moved.reshape(self.per_key, self.key_heads, head_dim, *rest).swapaxes(0, 1)
        return np.ascontiguousarray(np.moveaxis(tiles.reshape(moved.shape), 0, axis))

    def grouped_after(self, array: np.ndarray, start: int, axis: int) -> np.ndarray:
        """grouped() on the rows from start on (the value part), the rows before kept."""
        if not self.tiled:
            return array
        head, values = np.split(array, [start], axis=axis)
        return np.concatenate([head, self.grouped(values, axis, self.value_dim)], axis=axis)
