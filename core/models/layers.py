"""The layer kinds an architecture is built from, as data.

A kind names its weights (relative to its layer's prefix) and the options that change its
arithmetic; it holds no arrays. Each backend implements every kind once and refuses, by name, a
kind it does not implement yet, so a new architecture that reuses these kinds is one new file in
this package and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Attention:
    """Grouped-query self-attention over the KV cache, rotary positions on every head dimension.

    Room to grow (each a field when an architecture needs it): partial rotary, an output gate
    (gated attention), a sliding window per layer."""

    qk_norm: bool = False  # RMSNorm over each head's queries and keys before the rotary step (Qwen3)
    biased: tuple[str, ...] = ()  # projections that add a bias, e.g. q, k and v in Qwen2

    prefix: ClassVar[str] = "self_attn"
    projections: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def weight_names(self) -> tuple[str, ...]:
        names = [f"{self.prefix}.{p}.weight" for p in self.projections]
        names += [f"{self.prefix}.{p}.bias" for p in self.biased]
        if self.qk_norm:
            names += [f"{self.prefix}.q_norm.weight", f"{self.prefix}.k_norm.weight"]
        return tuple(names)


@dataclass(frozen=True)
class DenseMLP:
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)). Room to grow: a mixture of experts is
    another kind beside this one, not an option of it."""

    biased: tuple[str, ...] = ()

    prefix: ClassVar[str] = "mlp"
    projections: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")

    def weight_names(self) -> tuple[str, ...]:
        return tuple([f"{self.prefix}.{p}.weight" for p in self.projections] +
                     [f"{self.prefix}.{p}.bias" for p in self.biased])


Mixer = Attention  # what mixes information across positions; linear attention joins it later
FeedForward = DenseMLP


@dataclass(frozen=True)
class DecoderLayer:
    """A pre-norm residual block: h += mixer(norm(h)); h += mlp(norm(h))."""

    mixer: Mixer
    mlp: FeedForward

    norms: ClassVar[tuple[str, ...]] = ("input_layernorm.weight", "post_attention_layernorm.weight")

    def weight_names(self) -> tuple[str, ...]:
        return self.norms + self.mixer.weight_names() + self.mlp.weight_names()

    def projections(self) -> list[tuple[Mixer | FeedForward, str]]:
        """(kind, projection name) for every projection, mixer first."""
        return [(kind, p) for kind in (self.mixer, self.mlp) for p in kind.projections]
