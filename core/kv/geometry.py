"""A model's geometry as far as memory is concerned: what `qwen-serve kv-table` tabulates for
the built-in Qwen3 family or any config.json, counted with qwen_serve.kv.memory."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..models import ARCHITECTURES
from ..models.architecture import sliding_window_layers
from ..models.layers import Attention, GatedDeltaNet, SparseMoE
from .memory import KVFormat, kv_bytes_at


@dataclass(frozen=True)
class KVGeometry:
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qk_norm: bool = True
    window: int | None = None  # positions a windowed layer keeps
    windowed_layers: int = 0  # layers that keep only the last `window` positions
    sparse_layers: int = 0  # layers with a mixture of experts in place of the dense MLP
    experts: int = 0  # per sparse layer
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_size: int = 0  # per sparse layer, a shared expert of this width (0: none)
    output_gate: bool = False  # attention's output gated by a projection as wide as its queries
    # Linear attention (Qwen3.5, Qwen3-Next): layers that keep a fixed-size state per sequence
    # instead of keys and values, its float32 bytes over all of them, and their parameters
    # (projections; the small per-head gates, convolution and norms kept in float)
    linear_layers: int = 0
    state_bytes: int = 0
    linear_projection_parameters: int = 0
    linear_float_parameters: int = 0

    @property
    def attention_layers(self) -> int:
        return self.num_layers - self.linear_layers

    @property
    def full_layers(self) -> int:
        return self.attention_layers - self.windowed_layers

    def bytes_per_token(self, fmt: KVFormat, kv_heads: int | None = None) -> int:
        """KV bytes of one token in every attention layer (windowed layers included); kv_heads
        overrides the model's, e.g. num_heads for "as if it were multi-head attention"."""
        return fmt.bytes_per_token(self.attention_layers, kv_heads or self.num_kv_heads, self.head_dim)

    def bytes_at(self, context: int, fmt: KVFormat, kv_heads: int | None = None) -> int:
        """One sequence's KV bytes at `context` tokens, windowed layers holding at most `window`,
        plus the linear-attention layers' state (whatever the context)."""
        per_layer = fmt.bytes_per_token(1, kv_heads or self.num_kv_heads, self.head_dim)
        return kv_bytes_at(context, per_layer, self.full_layers, self.windowed_layers, self.window) + self.state_bytes

    def with_window(self, window: int) -> "KVGeometry":
        """Every attention layer windowed: what the sliding-window KV cache holds."""
        return replace(self, name=f"{self.name} (window {window})", window=window,
                       windowed_layers=self.attention_layers)

    # --- weights ------------------------------------------------------------------------
    def table_parameters(self) -> int:
        """The embedding and, unless tied to it, the output head."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def projection_parameters(self, active: bool = False) -> int:
        """Every projection's parameters; active: only those one token reads (its experts)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + (h * q if self.output_gate else 0)
        dense = 3 * h * self.intermediate_size
        experts = (self.experts_per_token if active else self.experts) * 3 * h * self.expert_intermediate_size \
            + 3 * h * self.shared_expert_size
        return self.attention_layers * attention + self.linear_projection_parameters + \
            (self.num_layers - self.sparse_layers) * dense + self.sparse_layers * experts

    def norm_parameters(self) -> int:
        """The norms, the routers (and shared experts' gates) and linear attention's small tensors:
        the parameters kept in float32 whatever the weights."""
        qk_norms = self.attention_layers * (2 * self.head_dim if self.qk_norm else 0)
        routers = self.sparse_layers * (self.experts + (1 if self.shared_expert_size else 0)) * self.hidden_size
        return self.num_layers * 2 * self.hidden_size + qk_norms + self.hidden_size + routers + self.linear_float_parameters

    def parameters(self, active: bool = False) -> int:
        return self.table_parameters() + self.projection_parameters(active) + self.norm_parameters()

    def weight_bytes(self, weights: str, active: bool = False) -> int:
        """float32 / bfloat16: every parameter in that type. int4: this project's int4 layout
        (projections as 4-bit codes with a float16 scale and zero per 64 inputs, embedding /
        head as int8 rows with a float32 scale per row, norms and routers float32). active: the
        bytes one decoded token reads, the experts its router skips left out."""
        if weights in WEIGHT_BYTES:
            return self.parameters(active) * WEIGHT_BYTES[weights]
        if weights == "int4":
            projections = self.projection_parameters(active)
            tables = self.table_parameters() + (self.table_parameters() // self.hidden_size) * 4
            return projections // 2 + projections // 64 * 2 * 2 + tables + self.norm_parameters() * 4
        raise ValueError(f"weights must be one of {', '.join([*WEIGHT_BYTES, 'int4'])}, got {weights!r}")

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str) -> "KVGeometry":
        """Geometry of a config.json (Qwen2/Qwen3/Llama keys; hybrid window layouts counted by
        transformers' rule, qwen_serve.models.architecture.sliding_window_layers)."""
        if "text_config" in cfg:  # multimodal wrappers keep the decoder's keys one level down
            cfg = {**cfg, **cfg["text_config"]}
        heads = cfg["num_attention_heads"]
        architecture = ARCHITECTURES.get((cfg.get("architectures") or [""])[0])
        window, sliding = (architecture.window_layers if architecture else sliding_window_layers)(cfg)
        layers = [architecture.decoder_layer(cfg, i) for i in range(cfg["num_hidden_layers"])] if architecture else []
        sparse = [layer.mlp for layer in layers if isinstance(layer.mlp, SparseMoE)]
        linear = [layer.mixer for layer in layers if isinstance(layer.mixer, GatedDeltaNet)]
        h = cfg["hidden_size"]
        return cls(
            name=name, num_layers=cfg["num_hidden_layers"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or h // heads,
            hidden_size=h, intermediate_size=cfg.get("intermediate_size", 0),
            vocab_size=cfg["vocab_size"], tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=cfg.get("model_type", "").startswith("qwen3"),
            window=window if any(sliding) else None, windowed_layers=sum(sliding),
            sparse_layers=len(sparse), experts=sparse[0].num_experts if sparse else 0,
            experts_per_token=sparse[0].top_k if sparse else 0,
            expert_intermediate_size=sparse[0].intermediate_size if sparse else 0,
            shared_expert_size=sparse[0].shared_expert_size if sparse else 0,
            output_gate=any(isinstance(layer.mixer, Attention) and layer.mixer.output_gate for layer in layers),
            linear_layers=len(linear), state_bytes=sum(kind.state_bytes() for kind in linear),
            linear_projection_parameters=sum(h * (kind.conv_channels + 2 * kind.num_value_heads * kind.value_dim)
                                             for kind in linear),
            linear_float_parameters=sum(kind.parameters(h) + kind.value_dim - h * (
                kind.conv_channels + 2 * kind.num_value_heads * kind.value_dim) for kind in linear),  # and its norm
        )

    @classmethod
    def from_config_file(cls, path: str | Path) -> "KVGeometry":
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        try:
            cfg = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {file}: {exc}") from None
        try:
            return cls.from_hf_config(cfg, name=path.name if path.is_dir() else path.parent.name or file.name)
        except KeyError as exc:
            raise ValueError(f"{file}: config.json lacks {exc}") from None


WEIGHT_BYTES = {"float32": 4, "bfloat16": 2}

# The dense Qwen3 models as published. Layers and heads (Q / KV) from the Qwen3 technical report
# (arXiv 2505.09388, table 1); hidden, intermediate, head_dim 128, vocab 151936 and tied
# embeddings from each model's config.json on the Hugging Face hub (Qwen/Qwen3-<size>).
QWEN3_FAMILY = tuple(
    KVGeometry(f"Qwen3-{size}", layers, heads, 8, 128, hidden, intermediate, 151936, tied)
    for size, layers, heads, hidden, intermediate, tied in (
        ("0.6B", 28, 16, 1024, 3072, True),
        ("1.7B", 28, 16, 2048, 6144, True),
        ("4B", 36, 32, 2560, 9728, True),
        ("8B", 36, 32, 4096, 12288, False),
        ("14B", 40, 40, 5120, 17408, False),
        ("32B", 64, 64, 5120, 25600, False),
    )
) + (
    # Qwen/Qwen3-30B-A3B's config.json: 48 layers, 32 / 4 heads x 128, hidden 2048, every layer
    # sparse with 128 experts of 768, 8 per token; untied. 30.5B parameters, 3.3B read per token.
    KVGeometry("Qwen3-30B-A3B", 48, 32, 4, 128, 2048, 6144, 151936, False, sparse_layers=48, experts=128,
               experts_per_token=8, expert_intermediate_size=768),
)
