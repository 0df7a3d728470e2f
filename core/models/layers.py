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
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    biased: tuple[str, ...] = ()

    prefix: ClassVar[str] = "mlp"
    projections: ClassVar[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")

    def weight_names(self) -> tuple[str, ...]:
        return tuple([f"{self.prefix}.{p}.weight" for p in self.projections] +
                     [f"{self.prefix}.{p}.bias" for p in self.biased])


@dataclass(frozen=True)
class SparseMoE:
    """A mixture of SwiGLU experts (Qwen3-MoE): a router scores every expert in float32, softmax
    over the experts, the top_k most probable run on the token, renormalized to sum to 1 when
    normalize_top_k, and the output is their weighted sum. Each expert is a DenseMLP of
    intermediate_size under ``experts.{e}``; the router is ``gate`` (kept in float, never quantized)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    normalize_top_k: bool = False

    prefix: ClassVar[str] = "mlp"
    router: ClassVar[str] = "gate"
    biased: ClassVar[tuple[str, ...]] = ()
    expert_projections: ClassVar[tuple[str, ...]] = DenseMLP.projections

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"a mixture of {self.num_experts} experts cannot route each token to {self.top_k}")

    @staticmethod
    def expert(index: int) -> str:
        return f"experts.{index}"

    @property
    def projections(self) -> tuple[str, ...]:
        """Every expert's gate, up and down, e.g. "experts.5.up_proj": what int4 quantizes."""
        return tuple(f"{self.expert(e)}.{p}" for e in range(self.num_experts) for p in self.expert_projections)

    def weight_names(self) -> tuple[str, ...]:
        return (f"{self.prefix}.{self.router}.weight",) + tuple(f"{self.prefix}.{p}.weight" for p in self.projections)

    def shapes(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        """Each weight's [rows, columns] as the config says, by weight name."""
        rows = {"gate_proj": (self.intermediate_size, hidden_size), "up_proj": (self.intermediate_size, hidden_size),
                "down_proj": (hidden_size, self.intermediate_size)}
        shapes = {f"{self.prefix}.{self.router}.weight": (self.num_experts, hidden_size)}
        shapes.update({f"{self.prefix}.{p}.weight": rows[p.rsplit(".", 1)[1]] for p in self.projections})
        return shapes


Mixer = Attention  # what mixes information across positions; linear attention joins it later
FeedForward = DenseMLP | SparseMoE


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
