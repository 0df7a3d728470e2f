"""A model's geometry and its layers as the backends build them: a frozen dataclass, no
framework types. The architecture files read it from config.json (or GGUF metadata)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..sampling.defaults import SamplingDefaults
from .layers import DecoderLayer, DenseMLP, SparseMoE


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    layers: tuple[DecoderLayer, ...] = ()  # one per decoder layer; empty for geometry-only uses (KV tests)
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    name: str = "model"
    sliding_window: int | None = None  # every layer attends over only the last this many positions
    sampling_defaults: SamplingDefaults = SamplingDefaults()  # the checkpoint's generation_config.json
    # An embedding model: how the checkpoint says it pools its hidden states ("last": the last
    # token's, as Qwen3-Embedding; "mean", "cls"...), None for a model that generates.
    pooling: str | None = None
    # Embedding widths it was trained to be cut to (Matryoshka): None, not trained for it; ()
    # any width up to hidden_size; else those widths.
    matryoshka_dimensions: tuple[int, ...] | None = None
    head: bool = True  # False: built without the language-model head (serving embeddings only)

    def __post_init__(self) -> None:
        if self.layers and len(self.layers) != self.num_layers:
            raise ValueError(f"{len(self.layers)} layer descriptions for {self.num_layers} layers")

    def parameters(self) -> int:
        """The model's parameters as its layer descriptions count them (the norms left out)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        tables = self.vocab_size * h * (1 if self.tie_word_embeddings or not self.head else 2)
        attention = 2 * h * q + 2 * h * kv
        return tables + sum(attention + mlp_parameters(layer.mlp, h, self.intermediate_size) for layer in self.layers)

    def with_eos(self, extra: tuple[int, ...]) -> "ModelConfig":
        merged = tuple(dict.fromkeys(self.eos_token_ids + extra))
        return dataclasses.replace(self, eos_token_ids=merged)


def mlp_parameters(kind: DenseMLP | SparseMoE, hidden: int, intermediate: int) -> int:
    if isinstance(kind, SparseMoE):
        return kind.num_experts * (3 * hidden * kind.intermediate_size + hidden)  # experts and router rows
    return 3 * hidden * intermediate

