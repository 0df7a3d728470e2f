"""What an architecture file declares, and the config.json reader every architecture shares.

The fields read here are the Llama family's (vocabulary, widths, heads, rotary base, norms,
tied embeddings, end tokens, the sliding window); an architecture adds its own by reading more of
the same dict in its ``decoder_layer``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .config import ModelConfig
from .layers import DecoderLayer


def sliding_window_layers(cfg: dict[str, Any]) -> tuple[int | None, tuple[bool, ...]]:
    """(window, which layers attend over only the last `window` positions), by transformers'
    rule for Qwen2/Qwen3 configs: nothing slides unless ``use_sliding_window``; then
    ``layer_types`` says which layers do, or else every layer from ``max_window_layers`` on."""
    layers = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    if window is None:
        return None, (False,) * layers
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", layers)
        return window, tuple(i >= first for i in range(layers))
    return window, tuple(t == "sliding_attention" for t in types)


def every_layer_windowed(cfg: dict[str, Any]) -> tuple[int | None, tuple[bool, ...]]:
    """transformers' rule for Qwen3-MoE: with ``use_sliding_window`` every layer slides."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    return window, (window is not None,) * cfg["num_hidden_layers"]


@dataclass(frozen=True)
class Architecture:
    hf_name: str  # config.json's "architectures"[0]
    decoder_layer: Callable[[dict[str, Any], int], DecoderLayer]  # (config.json, layer index) -> its kinds
    gguf_name: str | None = None  # GGUF's general.architecture, when llama.cpp converts it
    gguf_rope_permuted: bool = False  # llama.cpp's converter permutes this architecture's q/k rows
    # (a metadata field under the architecture's prefix, config.json as read so far) -> the
    # config.json keys this architecture reads from a GGUF file beyond the shared ones
    gguf_config: Callable[[Callable[[str], Any], dict[str, Any]], dict[str, Any]] | None = None
    # GGUF's names inside a block -> transformers', beyond the shared ones (checkpoints/gguf.py)
    gguf_layer_names: tuple[tuple[str, str], ...] = ()
    # (transformers' tensor name, config.json) -> what undoes llama.cpp's converter's change to its
    # values, or None where it stored them as they were
    gguf_undo: Callable[[str, dict[str, Any]], Callable[[Any], Any] | None] = lambda name, config: None
    # (config.json) -> (window, which layers attend over only the last `window` positions)
    window_layers: Callable[[dict[str, Any]], tuple[int | None, tuple[bool, ...]]] = sliding_window_layers
    # (name, array, config) -> the tensors under the names the layer kinds read: a checkpoint
    # tensor renamed, split (a gate stored inside q_proj) or dropped (weights for another task)
    tensors: Callable[[str, Any, ModelConfig], Iterable[tuple[str, Any]]] = lambda name, array, config: ((name, array),)
    norm_offset: float = 0.0  # what its RMSNorm scales are stored relative to (ModelConfig.norm_offset)
    # (config.json) -> a multi-token-prediction layer's kinds, for checkpoints that declare
    # mtp_num_hidden_layers (None: the architecture has no such head)
    draft_layer: Callable[[dict[str, Any]], DecoderLayer] | None = None


def read_model_config(architecture: Architecture, cfg: dict[str, Any], name: str) -> ModelConfig:
    """config.json (transformers' keys, 4.x or 5.x) -> ModelConfig; ValueError names what is
    not supported."""
    window, sliding = architecture.window_layers(cfg)
    if any(sliding) and not all(sliding):
        raise ValueError(f"hybrid attention is not supported: {sum(sliding)} of {len(sliding)} layers "
                         f"attend over a sliding window of {window} tokens, the others over everything")
    heads = cfg["num_attention_heads"]
    # transformers 5 nests rope settings under rope_parameters; 4.x keeps rope_theta flat.
    rope = cfg.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type") or (cfg.get("rope_scaling") or {}).get("rope_type", "default")
    if rope_type not in ("default", None):
        raise ValueError(f"rope scaling {rope_type!r} is not supported")
    eos = cfg.get("eos_token_id")
    num_layers = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rotary_fraction = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return ModelConfig(
        architecture=architecture.hf_name,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg.get("intermediate_size", 0),  # 0: every layer a mixture of experts
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rope_theta=float(rope_theta),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        layers=tuple(architecture.decoder_layer(cfg, i) for i in range(num_layers)),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        bos_token_id=cfg.get("bos_token_id"),
        name=name,
        sliding_window=window if all(sliding) else None,
        rotary_dim=None if rotary_fraction == 1.0 else int(head_dim * rotary_fraction),
        norm_offset=architecture.norm_offset,
        head_draft_layers=tuple(architecture.draft_layer(cfg) for _ in range(cfg.get("mtp_num_hidden_layers", 0)))
        if architecture.draft_layer is not None else (),
    )
