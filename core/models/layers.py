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
    """Grouped-query self-attention over the KV cache, rotary positions on the first
    ModelConfig.rotary_dim dimensions of every head.

    With output_gate (Qwen3.5, Qwen3-Next: gated attention) the output is multiplied by
    sigmoid(output_gate_proj(x)) before o_proj; the checkpoints store the gate's rows inside
    q_proj, which the architecture's reader splits off (qwen3_5.py)."""

    qk_norm: bool = False  # RMSNorm over each head's queries and keys before the rotary step (Qwen3)
    biased: tuple[str, ...] = ()  # projections that add a bias, e.g. q, k and v in Qwen2
    output_gate: bool = False

    prefix: ClassVar[str] = "self_attn"

    @property
    def projections(self) -> tuple[str, ...]:
        gate = ("output_gate_proj",) if self.output_gate else ()
        return ("q_proj", "k_proj", "v_proj") + gate + ("o_proj",)

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
    intermediate_size under ``experts.{e}``; the router is ``gate`` (kept in float, never quantized).

    With shared_expert_size (Qwen3.5-MoE, Qwen3-Next) one more SwiGLU of that width runs on every
    token under ``shared_expert``, its output scaled by sigmoid(shared_expert_gate(x)) and added."""

    num_experts: int
    top_k: int
    intermediate_size: int
    normalize_top_k: bool = False
    shared_expert_size: int = 0

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

    shared: ClassVar[str] = "shared_expert"
    shared_gate: ClassVar[str] = "shared_expert_gate"  # [1, hidden], kept in float like the router

    @property
    def projections(self) -> tuple[str, ...]:
        """Every expert's gate, up and down, e.g. "experts.5.up_proj", then the shared expert's:
        what int4 quantizes."""
        shared = tuple(f"{self.shared}.{p}" for p in self.expert_projections) if self.shared_expert_size else ()
        return tuple(f"{self.expert(e)}.{p}" for e in range(self.num_experts) for p in self.expert_projections) + shared

    def weight_names(self) -> tuple[str, ...]:
        gates = (self.router,) + ((self.shared_gate,) if self.shared_expert_size else ())
        return tuple(f"{self.prefix}.{g}.weight" for g in gates) + tuple(f"{self.prefix}.{p}.weight" for p in self.projections)

    def shapes(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        """Each weight's [rows, columns] as the config says, by weight name."""
        def rows(projection: str, width: int) -> tuple[int, int]:
            return (hidden_size, width) if projection == "down_proj" else (width, hidden_size)

        shapes = {f"{self.prefix}.{self.router}.weight": (self.num_experts, hidden_size)}
        for p in self.projections:
            owner, projection = p.rsplit(".", 1)
            width = self.shared_expert_size if owner == self.shared else self.intermediate_size
            shapes[f"{self.prefix}.{p}.weight"] = rows(projection, width)
        if self.shared_expert_size:
            shapes[f"{self.prefix}.{self.shared_gate}.weight"] = (1, hidden_size)
        return shapes


@dataclass(frozen=True)
class GatedDeltaNet:
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next; Yang, Kautz and Hatamizadeh, "Gated
    Delta Networks", 2024): a recurrent state per sequence instead of keys and values per token.

    in_proj_qkv(x) passes a causal depthwise convolution of conv_kernel taps (then SiLU) and splits
    into queries and keys (num_key_heads x key_dim, L2-normalized per head) and values
    (num_value_heads x value_dim); value head h reads key head h // (num_value_heads /
    num_key_heads). Per value head the state S [key_dim, value_dim] decays by exp(g) and takes a
    delta-rule write of strength beta = sigmoid(in_proj_b(x)), g = -exp(A_log) *
    softplus(in_proj_a(x) + dt_bias); the output S^T q is RMS-normed per head (norm.weight, a
    plain scale), gated by silu(in_proj_z(x)) and projected by out_proj. The state a sequence
    carries is the convolution's last conv_kernel - 1 inputs and S, both float32."""

    num_key_heads: int
    num_value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int

    prefix: ClassVar[str] = "linear_attn"
    projections: ClassVar[tuple[str, ...]] = ("in_proj_qkv", "in_proj_z", "out_proj")  # int4 under quant
    gates: ClassVar[tuple[str, ...]] = ("in_proj_a", "in_proj_b")  # one row per value head: kept float

    def __post_init__(self) -> None:
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"{self.num_value_heads} value heads cannot share {self.num_key_heads} key heads evenly")
        if self.conv_kernel < 1:
            raise ValueError(f"a convolution of {self.conv_kernel} taps")

    @property
    def conv_channels(self) -> int:
        """Width of in_proj_qkv's output, which the convolution runs over: queries, keys, values."""
        return 2 * self.num_key_heads * self.key_dim + self.num_value_heads * self.value_dim

    def state_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """A sequence's (convolution history [conv_kernel - 1, conv_channels], recurrent state
        [num_value_heads, key_dim, value_dim]), float32."""
        return (self.conv_kernel - 1, self.conv_channels), (self.num_value_heads, self.key_dim, self.value_dim)

    def state_bytes(self) -> int:
        (taps, channels), (heads, k, v) = self.state_shapes()
        return 4 * (taps * channels + heads * k * v)

    def parameters(self, hidden: int) -> int:
        """Its weights but the output norm's (value_dim): projections, per-head gates with A_log
        and dt_bias, the convolution."""
        value_width = self.num_value_heads * self.value_dim
        return hidden * (self.conv_channels + 2 * value_width + 2 * self.num_value_heads) + \
            self.conv_channels * self.conv_kernel + 2 * self.num_value_heads

    def weight_names(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}.{p}.weight" for p in self.projections + self.gates + ("conv1d", "norm")) + \
            (f"{self.prefix}.A_log", f"{self.prefix}.dt_bias")


Mixer = Attention | GatedDeltaNet  # what mixes information across positions
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
