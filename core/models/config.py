"""A model's geometry and its layers as the backends build them: a frozen dataclass, no
framework types. The architecture files read it from config.json (or GGUF metadata)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..sampling.defaults import SamplingDefaults
from .layers import Attention, DecoderLayer, DenseMLP, GatedDeltaNet, Mixer, SparseMoE


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
    rotary_dim: int | None = None  # head dimensions the rotary step turns (the first ones); None: all
    # RMSNorm scales stored zero-centred (Qwen3.5, Qwen3-Next: the scale is 1 + weight): added at load
    norm_offset: float = 0.0
    # A multi-token-prediction head's layers (Qwen3.5: mtp.layers.*): what the checkpoint has, and
    # what is built (the same, only when a proposer drafts with them; else none is read). The
    # built ones' keys and values take the KV layers after the decoder's.
    head_draft_layers: tuple[DecoderLayer, ...] = ()
    draft_layers: tuple[DecoderLayer, ...] = ()

    def __post_init__(self) -> None:
        if self.layers and len(self.layers) != self.num_layers:
            raise ValueError(f"{len(self.layers)} layer descriptions for {self.num_layers} layers")

    @property
    def rotary_dims(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def kv_layers(self) -> int:
        """Layers that keep keys and values per token (attention); a linear-attention layer keeps
        a recurrent state per sequence instead. Every layer, for a geometry-only config."""
        if not self.layers:
            return self.num_layers
        return sum(isinstance(layer.mixer, Attention) for layer in self.layers + self.draft_layers)

    def linear_attention(self) -> list[GatedDeltaNet]:
        """The recurrent-state layers, in order (the state storage numbers them so)."""
        return [layer.mixer for layer in self.layers if isinstance(layer.mixer, GatedDeltaNet)]

    def mixer_indices(self) -> list[int]:
        """Each layer's index among the layers of its mixer's kind: its KV layer (attention) or its
        state layer (linear attention); the draft layers' follow the decoder's."""
        seen: dict[type, int] = {}
        indices = []
        for layer in self.layers + self.draft_layers:
            indices.append(seen.get(type(layer.mixer), 0))
            seen[type(layer.mixer)] = indices[-1] + 1
        return indices

    def parameters(self) -> int:
        """The model's parameters as its layer descriptions count them (the norms left out)."""
        h = self.hidden_size
        tables = self.vocab_size * h * (1 if self.tie_word_embeddings or not self.head else 2)
        draft_inputs = 2 * h * h * bool(self.draft_layers)  # the head's fc: [embedding, hidden] -> hidden
        return tables + draft_inputs + sum(self.mixer_parameters(layer.mixer) +
                                           mlp_parameters(layer.mlp, h, self.intermediate_size)
                                           for layer in self.layers + self.draft_layers)

    def mixer_parameters(self, kind: Mixer) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if isinstance(kind, GatedDeltaNet):
            return kind.parameters(h)
        return 2 * h * q + 2 * h * kv + (h * q if kind.output_gate else 0)

    def with_eos(self, extra: tuple[int, ...]) -> "ModelConfig":
        merged = tuple(dict.fromkeys(self.eos_token_ids + extra))
        return dataclasses.replace(self, eos_token_ids=merged)


def mlp_parameters(kind: DenseMLP | SparseMoE, hidden: int, intermediate: int) -> int:
    if isinstance(kind, SparseMoE):  # experts and router rows, the shared expert and its gate
        return kind.num_experts * (3 * hidden * kind.intermediate_size + hidden) + \
            (3 * hidden * kind.shared_expert_size + hidden if kind.shared_expert_size else 0)
    return 3 * hidden * intermediate

