"""Qwen3.5 (and 3.6, 3.8: the same architecture), dense: Qwen3_5ForCausalLM, and the text part of
Qwen3_5ForConditionalGeneration. Three of every four layers are Gated DeltaNet linear attention,
the rest gated full attention (Qwen3's q/k norm, an output gate, rotary on a quarter of each head);
every RMSNorm scale is stored zero-centred. A multimodal checkpoint keeps the decoder's fields
under text_config and its tensors under model.language_model; its vision tower is not read."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ModelLoadError
from .architecture import Architecture
from .config import ModelConfig
from .draft_head import PREFIX as DRAFT_PREFIX
from .layers import Attention, DecoderLayer, DenseMLP, GatedDeltaNet, Mixer
from .qwen3_5_gguf import LAYER_NAMES as GGUF_LAYER_NAMES
from .qwen3_5_gguf import gguf_config, undo

NOT_TEXT = ("model.visual.",)  # the vision tower
DRAFT_HEAD = f"{DRAFT_PREFIX}."  # the multi-token-prediction head: read only when a proposer drafts with it


def layer_types(cfg: dict[str, Any]) -> list[str]:
    """Each layer's mixer, "linear_attention" or "full_attention": config.json's layer_types, or
    every full_attention_interval-th layer full (transformers' default, 4)."""
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.get("full_attention_interval", 4)
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= {"linear_attention", "full_attention"}:
        raise ModelLoadError(f"config.json: layer_types must name linear_attention or full_attention for each of "
                             f"{layers} layers, got {types!r}")
    return list(types)


def linear_attention(cfg: dict[str, Any]) -> GatedDeltaNet:
    try:
        return GatedDeltaNet(num_key_heads=cfg["linear_num_key_heads"], num_value_heads=cfg["linear_num_value_heads"],
                             key_dim=cfg["linear_key_head_dim"], value_dim=cfg["linear_value_head_dim"],
                             conv_kernel=cfg.get("linear_conv_kernel_dim", 4))
    except KeyError as missing:
        raise ModelLoadError(f"config.json lacks {missing.args[0]!r}, which a linear-attention layer needs") from None
    except ValueError as exc:
        raise ModelLoadError(f"config.json: {exc}") from None


def gated_attention(cfg: dict[str, Any]) -> Attention:
    biased = ("q_proj", "k_proj", "v_proj", "o_proj") if cfg.get("attention_bias") else ()
    return Attention(qk_norm=True, biased=biased, output_gate=True)


def mixer(cfg: dict[str, Any], index: int) -> Mixer:
    return linear_attention(cfg) if layer_types(cfg)[index] == "linear_attention" else gated_attention(cfg)


def decoder_layer(cfg: dict[str, Any], index: int) -> DecoderLayer:
    return DecoderLayer(mixer(cfg, index), DenseMLP())


def draft_layer_of(decoder_layer: Callable[[dict[str, Any], int], DecoderLayer]) -> Callable[[dict[str, Any]], DecoderLayer]:
    """The MTP head's layer for a family: gated full attention and the feed-forward the family's
    placement gives its first layer (a dense MLP, or a mixture of experts), as vLLM builds it."""
    return lambda cfg: DecoderLayer(gated_attention(cfg), decoder_layer(cfg, 0).mlp)


draft_layer = draft_layer_of(decoder_layer)


def text_tensors(name: str, array: Any, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    """The decoder's tensors under the causal LM's names. q_proj holds, per head, the queries'
    rows then the output gate's: split into q_proj and output_gate_proj, so q, k, v and the gate
    stack into one matmul like any projections that read the same input."""
    if name.startswith(NOT_TEXT) or (name.startswith(DRAFT_HEAD) and not config.draft_layers):
        return
    name = name.replace("model.language_model.", "model.", 1)
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        heads, head_dim = config.num_heads, config.head_dim
        if hasattr(array, "take_rows"):  # int4 from a GGUF file's Q4_0 blocks: no reshape, its rows
            rows = np.arange(heads * 2 * head_dim).reshape(heads, 2, head_dim)
            yield name, take_rows(array, rows[:, 0].ravel())
            yield name.replace("q_proj", "output_gate_proj"), take_rows(array, rows[:, 1].ravel())
            return
        per_head = array.reshape(heads, 2, head_dim, *array.shape[1:])
        rest = tuple(array.shape[1:])
        yield name, per_head[:, 0].reshape(heads * head_dim, *rest)
        yield name.replace("q_proj", "output_gate_proj"), per_head[:, 1].reshape(heads * head_dim, *rest)
        return
    yield name, array


def take_rows(array: Any, rows: np.ndarray) -> Any:
    """array[rows] for numpy and torch; an MLX array takes no numpy index, so it goes through numpy;
    int4 from a GGUF file's Q4_0 blocks (quant.int4.Int4Weight) takes its own rows."""
    if hasattr(array, "take_rows"):
        return array.take_rows(rows)
    try:
        return array[rows]
    except ValueError:
        return type(array)(np.asarray(array)[rows])


ARCHITECTURE = Architecture(hf_name="Qwen3_5ForCausalLM", decoder_layer=decoder_layer, tensors=text_tensors,
                            norm_offset=1.0, draft_layer=draft_layer, gguf_name="qwen35", gguf_config=gguf_config,
                            gguf_layer_names=tuple(GGUF_LAYER_NAMES.items()), gguf_undo=undo)
MULTIMODAL = Architecture(hf_name="Qwen3_5ForConditionalGeneration", decoder_layer=decoder_layer,
                          tensors=text_tensors, norm_offset=1.0, draft_layer=draft_layer)
