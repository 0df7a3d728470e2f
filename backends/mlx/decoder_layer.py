"""The layer kinds of qwen_serve.models.layers on MLX, each implemented once with MLX's fused
kernels (rms_norm, rope, scaled_dot_product_attention); model.py stacks them in the order an
architecture's description lists."""
from __future__ import annotations

from typing import Callable, Iterator

from qwen_serve.models.built_layer import BuiltLayer
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.layers import Attention, DecoderLayer, DenseMLP
from qwen_serve.models.weights import TensorsByName
from qwen_serve.protocols import KVCache

from .attention import CachedAttention
from .linear import Linear
from .mx import mx
from .step_layout import StepLayout


class LayerWeights:
    """One decoder layer's tensors under its prefix, projections made by the backend's linear
    factory (float or quantized)."""

    def __init__(self, tensors: TensorsByName, prefix: str, make_linear: Callable[..., Linear]) -> None:
        self.tensors, self.prefix, self.make_linear = tensors, prefix, make_linear

    def norm(self, name: str) -> mx.array:
        return self.tensors.take(f"{self.prefix}.{name}").astype(mx.float32)

    def linear(self, kind, projection: str) -> Linear:
        name = f"{self.prefix}.{kind.prefix}.{projection}"
        bias = self.tensors.take(f"{name}.bias") if projection in kind.biased else None
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
    step, attention over the cache, then o."""

    def __init__(self, kind: Attention, weights: LayerWeights) -> None:
        self.kind, self.prefix = kind, f"{weights.prefix}.{kind.prefix}"
        for p in kind.projections:
            setattr(self, p, weights.linear(kind, p))
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
        out = attention(index, q, k, v, cache, step)
        return self.o_proj(out.reshape(T, c.num_heads * c.head_dim))


class DenseMLPLayer(Projections):
    """models.layers.DenseMLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, kind: DenseMLP, weights: LayerWeights) -> None:
        self.kind, self.prefix = kind, f"{weights.prefix}.{kind.prefix}"
        for p in kind.projections:
            setattr(self, p, weights.linear(kind, p))

    def norms(self) -> list[mx.array]:
        return []

    def __call__(self, x: mx.array) -> mx.array:
        gate = self.gate_proj(x)
        return self.down_proj(gate * mx.sigmoid(gate) * self.up_proj(x))


IMPLEMENTED = {Attention: AttentionLayer, DenseMLP: DenseMLPLayer}


def build_layer(description: DecoderLayer, weights: LayerWeights) -> BuiltLayer:
    return BuiltLayer.build(description, weights, IMPLEMENTED, "mlx")


def rope(x: mx.array, positions: mx.array, config: ModelConfig) -> mx.array:
    # Each token is its own batch entry of length 1, so one offset per token places it.
    # traditional=False rotates the two halves of each head, as transformers does.
    rotated = mx.fast.rope(x[:, :, None, :], config.head_dim, traditional=False,
                           base=config.rope_theta, scale=1.0, offset=positions)
    return rotated[:, :, 0, :]
