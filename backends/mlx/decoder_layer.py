"""The layer kinds of qwen_serve.models.layers on MLX, each implemented once with MLX's fused
kernels (rms_norm, rope, scaled_dot_product_attention); model.py stacks them in the order an
architecture's description lists."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from qwen_serve.models.built_layer import BuiltLayer
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.expert_groups import group_by_expert
from qwen_serve.models.layers import Attention, DecoderLayer, DenseMLP, GatedDeltaNet, SparseMoE
from qwen_serve.models.weights import TensorsByName
from qwen_serve.protocols import KVCache

from .attention import CachedAttention
from .gated_deltanet import GatedDeltaNetLayer
from .linear import Linear
from .mx import mx
from .step_layout import StepLayout


class LayerWeights:
    """One decoder layer's tensors under its prefix, projections made by the backend's linear
    factory (float or quantized); RMSNorm scales as stored plus norm_offset (ModelConfig)."""

    def __init__(self, tensors: TensorsByName, prefix: str, make_linear: Callable[..., Linear],
                 norm_offset: float = 0.0) -> None:
        self.tensors, self.prefix, self.make_linear, self.norm_offset = tensors, prefix, make_linear, norm_offset

    def norm(self, name: str) -> mx.array:
        return self.tensors.take(f"{self.prefix}.{name}").astype(mx.float32) + self.norm_offset

    def linear(self, kind_prefix: str, projection: str, biased: bool) -> Linear:
        name = f"{self.prefix}.{kind_prefix}.{projection}"
        bias = self.tensors.take(f"{name}.bias") if biased else None
        return self.make_linear(self.tensors.take(f"{name}.weight"), bias)


class Projections:
    """A kind's projections as attributes named as in the checkpoint (q_proj ... down_proj), which
    is what calibration watches."""

    kind: Attention | DenseMLP
    prefix: str

    def linears(self) -> list[Linear]:
        return [getattr(self, p) for p in self.kind.projections]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for p in self.kind.projections:
            yield f"{self.prefix}.{p}.weight", self, p


class AttentionLayer(Projections):
    """models.layers.Attention: q, k, v, per-head q/k RMSNorm when the kind has it, the rotary
    step, attention over the cache, gated by sigmoid(output_gate_proj(x)) when the kind has it,
    then o."""

    def __init__(self, kind: Attention, weights: LayerWeights) -> None:
        self.kind, self.prefix = kind, f"{weights.prefix}.{kind.prefix}"
        for p in kind.projections:
            setattr(self, p, weights.linear(kind.prefix, p, p in kind.biased))
        self.q_norm = weights.norm(f"{kind.prefix}.q_norm.weight") if kind.qk_norm else None
        self.k_norm = weights.norm(f"{kind.prefix}.k_norm.weight") if kind.qk_norm else None

    def norms(self) -> list[mx.array]:
        return [t for t in (self.q_norm, self.k_norm) if t is not None]

    def __call__(self, index: int, x: mx.array, cache: KVCache, step: StepLayout, config: ModelConfig,
                 attention: CachedAttention) -> mx.array:
        c, T = config, x.shape[0]
        q = self.q_proj(x).reshape(T, c.num_heads, c.head_dim)
        k = self.k_proj(x).reshape(T, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).reshape(T, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None:
            q = mx.fast.rms_norm(q, self.q_norm, c.rms_norm_eps)
            k = mx.fast.rms_norm(k, self.k_norm, c.rms_norm_eps)
        q, k = rope(q, step.positions, c), rope(k, step.positions, c)
        out = attention(index, q, k, v, cache, step).reshape(T, c.num_heads * c.head_dim)
        if self.kind.output_gate:
            out = out * mx.sigmoid(self.output_gate_proj(x))
        return self.o_proj(out)


class DenseMLPLayer(Projections):
    """models.layers.DenseMLP: down(silu(gate(x)) * up(x)); also one expert of a SparseMoE, its
    weights under `kind_prefix` (e.g. "mlp.experts.5")."""

    def __init__(self, kind: DenseMLP, weights: LayerWeights, kind_prefix: str | None = None) -> None:
        kind_prefix = kind_prefix or kind.prefix
        self.kind, self.prefix = kind, f"{weights.prefix}.{kind_prefix}"
        for p in kind.projections:
            setattr(self, p, weights.linear(kind_prefix, p, p in kind.biased))

    def norms(self) -> list[mx.array]:
        return []

    def __call__(self, x: mx.array) -> mx.array:
        gate = self.gate_proj(x)
        return self.down_proj(gate * mx.sigmoid(gate) * self.up_proj(x))


class SparseMoELayer:
    """models.layers.SparseMoE: route every token in float32, then run each expert that some
    token picked once, on all of its tokens' rows together."""

    def __init__(self, kind: SparseMoE, weights: LayerWeights) -> None:
        self.kind = kind
        self.router = weights.tensors.take_router(weights.prefix, kind).astype(mx.float32)
        self.experts = [DenseMLPLayer(DenseMLP(), weights, f"{kind.prefix}.{kind.expert(e)}")
                        for e in range(kind.num_experts)]
        self.shared, self.shared_gate = None, None
        if kind.shared_expert_size:  # runs on every token, scaled by sigmoid(shared_expert_gate(x))
            self.shared = DenseMLPLayer(DenseMLP(), weights, f"{kind.prefix}.{kind.shared}")
            self.shared_gate = weights.tensors.take(f"{weights.prefix}.{kind.prefix}.{kind.shared_gate}.weight"
                                                    ).astype(mx.float32)

    def _all_experts(self) -> list[DenseMLPLayer]:
        return self.experts + ([self.shared] if self.shared is not None else [])

    def linears(self) -> list[Linear]:
        return [linear for expert in self._all_experts() for linear in expert.linears()]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for expert in self._all_experts():
            yield from expert.projections()

    def norms(self) -> list[mx.array]:
        """The float tensors beside the linears, as weight_bytes counts them."""
        return [self.router] + ([self.shared_gate] if self.shared_gate is not None else [])

    def __call__(self, x: mx.array) -> mx.array:
        probs = mx.softmax(x.astype(mx.float32) @ self.router.T, axis=-1)
        chosen = mx.argsort(-probs, axis=-1)[:, :self.kind.top_k]  # most probable first, as torch.topk
        weights = mx.take_along_axis(probs, chosen, axis=-1)
        if self.kind.normalize_top_k:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        out = run_experts_grouped(self.experts, x, weights, np.array(chosen))
        if self.shared is not None:
            out = out + (mx.sigmoid(x.astype(mx.float32) @ self.shared_gate.T) * self.shared(x)).astype(out.dtype)
        return out


def run_experts_grouped(experts: list, x: mx.array, weights: mx.array, chosen: np.ndarray) -> mx.array:
    """sum over j of weights[t, j] * experts[chosen[t, j]](x[t]) for every row t, each active
    expert called once on its rows (models.expert_groups)."""
    scale = weights.reshape(-1, 1).astype(x.dtype)
    out = mx.zeros_like(x)
    for group in group_by_expert(chosen):
        rows = mx.array(group.rows)
        out = out.at[rows].add(experts[group.expert](x[rows]) * scale[mx.array(group.slots)])
    return out


IMPLEMENTED = {Attention: AttentionLayer, DenseMLP: DenseMLPLayer, SparseMoE: SparseMoELayer,
               GatedDeltaNet: GatedDeltaNetLayer}


def build_layer(description: DecoderLayer, weights: LayerWeights) -> BuiltLayer:
    return BuiltLayer.build(description, weights, IMPLEMENTED, "mlx")


def rope(x: mx.array, positions: mx.array, config: ModelConfig) -> mx.array:
    # Each token is its own batch entry of length 1, so one offset per token places it.
    # traditional=False rotates the two halves of each head, as transformers does.
    # Only the first rotary_dims dimensions of each head turn (partial rotary, Qwen3.5).
    rotated = mx.fast.rope(x[:, :, None, :], config.rotary_dims, traditional=False,
                           base=config.rope_theta, scale=1.0, offset=positions)
    return rotated[:, :, 0, :]


def run_layer(layer: BuiltLayer, index: int, hidden: mx.array, cache: KVCache, step: StepLayout, config: ModelConfig,
              attention: CachedAttention) -> mx.array:
    """One decoder layer on the residual stream; index: its KV layer (attention) or state layer
    (linear attention)."""
    eps = config.rms_norm_eps
    hidden = hidden + layer.mixer(index, mx.fast.rms_norm(hidden, layer.input_norm, eps), cache, step, config, attention)
    return hidden + layer.mlp(mx.fast.rms_norm(hidden, layer.post_norm, eps))
