"""The decoder for Qwen3 and Llama checkpoints on MLX: same weights, names and maths as the
torch backend, with MLX's fused kernels (rms_norm, rope, scaled_dot_product_attention).

Qwen3 differs from Llama only by RMSNorm on each head's queries and keys; rope theta, head_dim
and tied embeddings come from the config.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from qwen_serve.checkpoints.checkpoint import PROJECTIONS
from qwen_serve.config import ModelConfig
from qwen_serve.errors import ModelLoadError
from qwen_serve.protocols import KVCache, SlidingWindow, StepBatch
from qwen_serve.quant.calibration import decoder_projections

from .attention import CachedAttention
from .linear import DenseLinear, Linear
from .mx import mx
from .step_layout import StepLayout, build_layout


@dataclass
class Layer:
    input_norm: mx.array
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: mx.array | None
    k_norm: mx.array | None
    post_norm: mx.array
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: dict[str, mx.array],
                 make_linear: Callable[..., Linear] = DenseLinear) -> None:
        self.config = config
        c = config

        def take(name: str) -> mx.array:
            try:
                return weights.pop(name)
            except KeyError:
                raise ModelLoadError(f"checkpoint lacks tensor {name!r}") from None

        def norm(name: str) -> mx.array:
            return take(name).astype(mx.float32)

        def linear(prefix: str):
            return make_linear(take(f"{prefix}.weight"), weights.pop(f"{prefix}.bias", None))

        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}"
            self.layers.append(Layer(
                input_norm=norm(f"{p}.input_layernorm.weight"),
                q_proj=linear(f"{p}.self_attn.q_proj"),
                k_proj=linear(f"{p}.self_attn.k_proj"),
                v_proj=linear(f"{p}.self_attn.v_proj"),
                o_proj=linear(f"{p}.self_attn.o_proj"),
                q_norm=norm(f"{p}.self_attn.q_norm.weight") if c.qk_norm else None,
                k_norm=norm(f"{p}.self_attn.k_norm.weight") if c.qk_norm else None,
                post_norm=norm(f"{p}.post_attention_layernorm.weight"),
                gate_proj=linear(f"{p}.mlp.gate_proj"),
                up_proj=linear(f"{p}.mlp.up_proj"),
                down_proj=linear(f"{p}.mlp.down_proj"),
            ))
        self.norm = norm("model.norm.weight")
        # The embedding is a weight of the same shape as the head, built the same way (as int8
        # under quant "int4"): with tied embeddings the lookup and the head read one array.
        self.embedding = make_linear(take("model.embed_tokens.weight"), None)
        head = weights.pop("lm_head.weight", None)
        if head is None and not c.tie_word_embeddings:
            raise ModelLoadError("checkpoint lacks lm_head.weight and does not tie embeddings")
        self.lm_head = self.embedding if head is None else make_linear(head, None)
        if weights:
            raise ModelLoadError(f"checkpoint has unexpected tensors, e.g. {sorted(weights)[:3]}")
        self.attention = CachedAttention(scale=c.head_dim ** -0.5)
        # Materialize here: MLX cannot evaluate an array whose pending ops were recorded on
        # another thread, and the server's engine runs on its own.
        mx.eval(self._norms(), [vars(x) for x in self._linears()])

    def projections(self):
        return decoder_projections(self.layers)

    @staticmethod
    def to_numpy(x: mx.array):
        return np.array(x.astype(mx.float32))

    def weight_bytes(self) -> int:
        return sum(x.nbytes() for x in self._linears()) + sum(t.nbytes for t in self._norms())

    def _linears(self) -> list[Linear]:
        every = [self.embedding, self.lm_head] + [getattr(layer, n) for layer in self.layers for n in PROJECTIONS]
        return list({id(x): x for x in every}.values())  # a tied head counts once

    def _norms(self) -> list[mx.array]:
        return [self.norm] + [t for layer in self.layers
                              for t in (layer.input_norm, layer.post_norm, layer.q_norm, layer.k_norm) if t is not None]

    def execute(self, batch: StepBatch, cache: KVCache) -> mx.array:
        sliding = cache if isinstance(cache, SlidingWindow) else None
        step = build_layout(batch, cache.block_size, cache.block_table, sliding)
        eps = self.config.rms_norm_eps
        hidden = self.embedding.rows(step.token_ids)
        for index, layer in enumerate(self.layers):
            x = mx.fast.rms_norm(hidden, layer.input_norm, eps)
            hidden = hidden + self._attention_block(index, layer, x, cache, step)
            x = mx.fast.rms_norm(hidden, layer.post_norm, eps)
            gate = layer.gate_proj(x)
            hidden = hidden + layer.down_proj(gate * mx.sigmoid(gate) * layer.up_proj(x))
        last = mx.fast.rms_norm(hidden[step.sample_rows], self.norm, eps)
        logits = self.lm_head(last)
        mx.eval(logits)
        return logits

    def _attention_block(self, index: int, layer: Layer, x: mx.array, cache: KVCache, step: StepLayout) -> mx.array:
        c = self.config
        T = x.shape[0]
        q = layer.q_proj(x).reshape(T, c.num_heads, c.head_dim)
        k = layer.k_proj(x).reshape(T, c.num_kv_heads, c.head_dim)
        v = layer.v_proj(x).reshape(T, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = mx.fast.rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = mx.fast.rms_norm(k, layer.k_norm, c.rms_norm_eps)
        q, k = self._rope(q, step.positions), self._rope(k, step.positions)
        out = self.attention(index, q, k, v, cache, step)
        return layer.o_proj(out.reshape(T, c.num_heads * c.head_dim))

    def _rope(self, x: mx.array, positions: mx.array) -> mx.array:
        # Each token is its own batch entry of length 1, so one offset per token places it.
        # traditional=False rotates the two halves of each head, as transformers does.
        rotated = mx.fast.rope(x[:, :, None, :], self.config.head_dim, traditional=False,
                               base=self.config.rope_theta, scale=1.0, offset=positions)
        return rotated[:, :, 0, :]
