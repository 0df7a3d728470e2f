"""The layer kinds of qwen_serve.models.layers on torch, each implemented once; model.py stacks
them in the order an architecture's description lists.

The projections that read one input run as one matmul (q, k, v; gate, up: merged_linear.py), and
the element-wise steps go through LayerOps (one fused kernel pass each where built).
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from qwen_serve.models.built_layer import BuiltLayer
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.expert_groups import group_by_expert
from qwen_serve.models.layers import Attention, DecoderLayer, DenseMLP, GatedDeltaNet, SparseMoE
from qwen_serve.models.weights import TensorsByName
from qwen_serve.protocols import KVCache

from .attention import CachedAttention
from .fused_experts import FusedExperts
from .gated_deltanet import GatedDeltaNetLayer
from .layer_ops import LayerOps
from .linear import DenseLinear
from .merged_linear import MergedLinear
from .step_layout import StepLayout

GATE_UP = ("gate_proj", "up_proj")


class LayerWeights:
    """One decoder layer's tensors under its prefix, projections made by the backend's linear
    factory (float, bf16 or int4); RMSNorm scales as stored plus norm_offset (ModelConfig)."""

    def __init__(self, tensors: TensorsByName, prefix: str, make_linear: Callable, norm_offset: float = 0.0) -> None:
        self.tensors, self.prefix, self.make_linear, self.norm_offset = tensors, prefix, make_linear, norm_offset

    def norm(self, name: str) -> torch.Tensor:
        return self.tensors.take(f"{self.prefix}.{name}").float() + self.norm_offset

    def linear(self, kind_prefix: str, projection: str, biased: bool):
        name = f"{self.prefix}.{kind_prefix}.{projection}"
        bias = self.tensors.take(f"{name}.bias") if biased else None
        return self.make_linear(self.tensors.take(f"{name}.weight"), bias)

    def merged(self, kind_prefix: str, projections: tuple[str, ...], biased: tuple[str, ...]) -> MergedLinear:
        names = [f"{self.prefix}.{kind_prefix}.{p}" for p in projections]
        biases = [self.tensors.take(f"{name}.bias") if p in biased else None for name, p in zip(names, projections)]
        return MergedLinear.from_weights(projections, [self.tensors.take(f"{name}.weight") for name in names], biases,
                                         self.make_linear)


class AttentionLayer:
    """models.layers.Attention: q, k and v (and the output gate) in one matmul, per-head q/k
    RMSNorm when the kind has it, the rotary step, attention over the cache, the gate, then o."""

    def __init__(self, kind: Attention, weights: LayerWeights) -> None:
        self.qkv = weights.merged(kind.prefix, kind.projections[:-1], kind.biased)  # everything but o_proj
        self.o_proj = weights.linear(kind.prefix, "o_proj", "o_proj" in kind.biased)
        self.q_norm = weights.norm(f"{kind.prefix}.q_norm.weight") if kind.qk_norm else None
        self.k_norm = weights.norm(f"{kind.prefix}.k_norm.weight") if kind.qk_norm else None
        self.output_gate = kind.output_gate  # the gate's columns follow v's in qkv's output
        self.prefix = f"{weights.prefix}.{kind.prefix}"

    def linears(self) -> list:
        return [self.qkv.linear, self.o_proj]

    def norms(self) -> list[torch.Tensor]:
        return [t for t in (self.q_norm, self.k_norm) if t is not None]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        """Calibratable.projections: the merged parts share its input, so each part's name
        watches the merged layer (a watcher calls on to the next)."""
        for name in self.qkv.names:
            yield f"{self.prefix}.{name}.weight", self.qkv, "linear"
        yield f"{self.prefix}.o_proj.weight", self, "o_proj"

    def __call__(self, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                 step: StepLayout, config: ModelConfig, ops: LayerOps, attention: CachedAttention) -> torch.Tensor:
        c, T = config, x.shape[0]
        q, k, v, *gate = self.qkv(x)  # column slices of one output
        q = ops.head_norm_rope(q.view(T, c.num_heads, c.head_dim), self.q_norm, c.rms_norm_eps, cos, sin)
        k = ops.head_norm_rope(k.view(T, c.num_kv_heads, c.head_dim), self.k_norm, c.rms_norm_eps, cos, sin)
        out = attention(index, q, k, v.view(T, c.num_kv_heads, c.head_dim), cache, step).reshape(T, -1)
        if gate:
            out = ops.sigmoid_mul(out, gate[0])
        return self.o_proj(out)


class SwiGLU:
    """down(silu(gate(x)) * up(x)) with gate and up in one matmul: a dense MLP or one expert,
    its weights under `kind_prefix` (e.g. "mlp" or "mlp.experts.5")."""

    def __init__(self, weights: LayerWeights, kind_prefix: str, biased: tuple[str, ...] = ()) -> None:
        self.gate_up = weights.merged(kind_prefix, GATE_UP, biased)
        self.down_proj = weights.linear(kind_prefix, "down_proj", "down_proj" in biased)
        self.prefix = f"{weights.prefix}.{kind_prefix}"

    def linears(self) -> list:
        return [self.gate_up.linear, self.down_proj]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for name in self.gate_up.names:
            yield f"{self.prefix}.{name}.weight", self.gate_up, "linear"
        yield f"{self.prefix}.down_proj.weight", self, "down_proj"

    def norms(self) -> list[torch.Tensor]:
        return []

    def __call__(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(*self.gate_up(x)))


class DenseMLPLayer(SwiGLU):
    """models.layers.DenseMLP."""

    def __init__(self, kind: DenseMLP, weights: LayerWeights) -> None:
        super().__init__(weights, kind.prefix, kind.biased)


class SparseMoELayer:
    """models.layers.SparseMoE: route every token in float32, then run each expert that some
    token picked once, on all of its tokens' rows together, so an expert's weights stream from
    memory once per step however many tokens chose it."""

    def __init__(self, kind: SparseMoE, weights: LayerWeights) -> None:
        self.kind = kind
        # float32 through the float32 kernel once prepacked, as linear attention's gates: a row's
        # routing does not depend on how many rows the step has
        self.router = DenseLinear(weights.tensors.take_router(weights.prefix, kind).float())
        self.experts = [SwiGLU(weights, f"{kind.prefix}.{kind.expert(e)}") for e in range(kind.num_experts)]
        self.fused = FusedExperts.for_experts(self.experts, kind.intermediate_size)  # None: one by one
        self.shared, self.shared_gate = None, None
        if kind.shared_expert_size:
            self.shared = SwiGLU(weights, f"{kind.prefix}.{kind.shared}")
            self.shared_gate = DenseLinear(
                weights.tensors.take(f"{weights.prefix}.{kind.prefix}.{kind.shared_gate}.weight").float())

    def linears(self) -> list:
        experts = self.experts + ([self.shared] if self.shared is not None else [])
        gates = [self.router] + ([self.shared_gate] if self.shared_gate is not None else [])
        return [linear for expert in experts for linear in expert.linears()] + gates

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for expert in self.experts + ([self.shared] if self.shared is not None else []):
            yield from expert.projections()

    def norms(self) -> list[torch.Tensor]:
        """The float tensors beside the linears, as weight_bytes counts them (the router and the
        shared expert's gate are among the linears)."""
        return []

    def __call__(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        # float32 throughout (the router: a float32 linear layer)
        weights, chosen = ops.route_top_k(self.router(x.float()), self.kind.top_k, self.kind.normalize_top_k)
        if self.fused is not None and self.fused.takes(chosen):
            out = self.fused(x, weights, chosen)
        else:
            out = run_experts_grouped(self.experts, x, weights, chosen, ops)
        if self.shared is not None:
            out = ops.add_sigmoid_gated(out, self.shared(x, ops), self.shared_gate(x.float()))
        return out


def run_experts_grouped(experts: list, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor,
                        ops: LayerOps | None) -> torch.Tensor:
    """sum over j of weights[t, j] * experts[chosen[t, j]](x[t]) for every row t, each active
    expert called once on its rows (models.expert_groups)."""
    scale = weights.reshape(-1, 1).to(x.dtype)
    out = torch.zeros_like(x)
    for group in group_by_expert(chosen.numpy()):
        rows = torch.from_numpy(group.rows)
        out.index_add_(0, rows, experts[group.expert](x.index_select(0, rows), ops) * scale[group.slots])
    return out


IMPLEMENTED = {Attention: AttentionLayer, GatedDeltaNet: GatedDeltaNetLayer, DenseMLP: DenseMLPLayer,
               SparseMoE: SparseMoELayer}


def build_layer(description: DecoderLayer, weights: LayerWeights) -> BuiltLayer:
    return BuiltLayer.build(description, weights, IMPLEMENTED, "torch")
