"""The decoder for Qwen3 and Llama checkpoints: one file, weights in plain tensors.

Qwen3 differs from Llama only by RMSNorm on each head's queries and keys; rope theta, head_dim
and tied embeddings come from the config.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen_serve.checkpoints.checkpoint import projection_weight_name
from qwen_serve.config import ModelConfig
from qwen_serve.errors import ModelLoadError
from qwen_serve.heap import return_free_heap
from qwen_serve.protocols import KVCache, StepBatch

from .attention import CachedAttention
from .fused_decode import FusedDecode
from .huge_pages import move_to_huge_pages
from .kernel_choice import choose_paths, describe
from .layer_ops import LayerOps
from .linear import DenseLinear
from .merged_linear import MergedLinear
from .native import load_kernels
from .paged_decode import paged_decode_layout
from .step_layout import StepLayout, build_layout

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: MergedLinear  # q_proj, k_proj, v_proj
    o_proj: DenseLinear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: MergedLinear  # gate_proj, up_proj
    down_proj: DenseLinear

    def linears(self) -> list:
        return [self.qkv.linear, self.o_proj, self.gate_up.linear, self.down_proj]


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], make_linear=DenseLinear) -> None:
        self.config = config
        self.weights = weights
        c = config

        def take(name: str) -> torch.Tensor:
            try:
                return weights.pop(name)
            except KeyError:
                raise ModelLoadError(f"checkpoint lacks tensor {name!r}") from None

        def linear(prefix: str):
            return make_linear(take(f"{prefix}.weight"), weights.pop(f"{prefix}.bias", None))

        def merged(prefix: str, names: tuple[str, ...]) -> MergedLinear:
            return MergedLinear(names, [linear(f"{prefix}.{name}") for name in names])

        # The embedding is a linear-like table (lookup() gives rows): float, or quantized by the
        # backend while loading; a tied lm_head is the very same object.
        self.embed = make_linear(take("model.embed_tokens.weight"), None)
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}"
            self.layers.append(Layer(
                input_norm=take(f"{p}.input_layernorm.weight").float(),
                qkv=merged(f"{p}.self_attn", QKV),
                o_proj=linear(f"{p}.self_attn.o_proj"),
                q_norm=take(f"{p}.self_attn.q_norm.weight").float() if c.qk_norm else None,
                k_norm=take(f"{p}.self_attn.k_norm.weight").float() if c.qk_norm else None,
                post_norm=take(f"{p}.post_attention_layernorm.weight").float(),
                gate_up=merged(f"{p}.mlp", GATE_UP),
                down_proj=linear(f"{p}.mlp.down_proj"),
            ))
        self.norm = take("model.norm.weight").float()
        head = weights.pop("lm_head.weight", None)
        if head is None and not c.tie_word_embeddings:
            raise ModelLoadError("checkpoint lacks lm_head.weight and does not tie embeddings")
        self.lm_head = self.embed if head is None else make_linear(head, None)
        if weights:
            raise ModelLoadError(f"checkpoint has unexpected tensors, e.g. {sorted(weights)[:3]}")
        self.kernels = kernels = load_kernels()
        if isinstance(self.lm_head, DenseLinear):
            self.lm_head.as_head(kernels)  # float32 logits; a tied table keeps lookup()
        # each packed shape's path per row count (a bf16 projection's layout too), then the layouts
        multiplied = [linear for linear in self.linears() if linear is not self.embed or linear is self.lm_head]
        self.kernel_choices = choose_paths(multiplied, kernels)
        for linear in [linear for layer in self.layers for linear in layer.linears()]:
            if isinstance(linear, DenseLinear):
                linear.prepack(kernels)
        if move_to_huge_pages(self.linears()):
            return_free_heap()  # the old copies
        self.attention = CachedAttention(scale=c.head_dim ** -0.5)
        self.ops = LayerOps(kernels)
        self.fused = FusedDecode.for_layers(self.layers, kernels)  # None: every step goes op by op
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
        self._rope_table = (torch.empty(0, c.head_dim), torch.empty(0, c.head_dim))

    def projections(self):
        """Calibratable.projections: a merged layer's parts share its input, so each part's name
        watches the merged layer (a watcher calls on to the next)."""
        for i, layer in enumerate(self.layers):
            for merged, single in ((layer.qkv, "o_proj"), (layer.gate_up, "down_proj")):
                for name in merged.names:
                    yield projection_weight_name(i, name), merged, "linear"
                yield projection_weight_name(i, single), layer, single

    @staticmethod
    def to_numpy(x: torch.Tensor):
        return x.detach().float().numpy()

    def linears(self) -> list:
        """Every weight-holding layer once: the embedding, the head (a tied head is the same
        object) and each decoder layer's projections."""
        every = [self.embed, self.lm_head] + [linear for layer in self.layers for linear in layer.linears()]
        return list({id(linear): linear for linear in every}.values())

    def kernel_table(self) -> list[str]:
        """KernelReport: the timings each quantized projection's paths were chosen from."""
        return describe(self.kernel_choices)

    def weight_bytes(self) -> int:
        total = sum(lin.nbytes() for lin in self.linears())
        norms = [self.norm] + [t for l in self.layers for t in (l.input_norm, l.post_norm, l.q_norm, l.k_norm) if t is not None]
        return total + sum(t.numel() * t.element_size() for t in norms)

    @torch.inference_mode()
    def execute(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        step = build_layout(batch, cache)
        step.paged = paged_decode_layout(step, cache, self.kernels)
        token_ids = torch.as_tensor([t for c in batch.chunks for t in c.token_ids], dtype=torch.long)
        hidden = self.embed.lookup(token_ids)
        cos, sin = self._rope(step.positions)
        ops, eps = self.ops, self.config.rms_norm_eps
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        if self.fused is not None and self.fused.applies(len(token_ids), step):
            mlp = self.fused(hidden, x, cos, sin, step, self.config, self.attention.scale)  # hidden in place
        else:
            hidden, mlp = self._layers(hidden, x, cos, sin, cache, step)
        if step.all_rows_sampled:
            last = hidden + mlp
        else:
            last = hidden.index_select(0, step.sample_rows) + mlp.index_select(0, step.sample_rows)
        return self.lm_head(ops.rms_norm(last, self.norm, eps))

    def _layers(self, hidden: torch.Tensor, x: torch.Tensor, cos, sin, cache: KVCache,
                step: StepLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer, op by op -> the residual before the last layer's MLP and that MLP's output
        (the last residual is added for the sampled rows only)."""
        ops, eps = self.ops, self.config.rms_norm_eps
        for index, layer in enumerate(self.layers):
            hidden, x = ops.add_rms_norm(hidden, self._attention_block(index, layer, x, cos, sin, cache, step),
                                         layer.post_norm, eps)
            mlp = layer.down_proj(ops.silu_mul(*layer.gate_up(x)))
            if index + 1 < len(self.layers):
                hidden, x = ops.add_rms_norm(hidden, mlp, self.layers[index + 1].input_norm, eps)
        return hidden, mlp

    def _attention_block(self, index: int, layer: Layer, x: torch.Tensor, cos, sin, cache: KVCache, step: StepLayout) -> torch.Tensor:
        c = self.config
        T = x.shape[0]
        q, k, v = layer.qkv(x)  # column slices of one output
        q = q.view(T, c.num_heads, c.head_dim)
        k = k.view(T, c.num_kv_heads, c.head_dim)
        v = v.view(T, c.num_kv_heads, c.head_dim)
        q = self.ops.head_norm_rope(q, layer.q_norm, c.rms_norm_eps, cos, sin)
        k = self.ops.head_norm_rope(k, layer.k_norm, c.rms_norm_eps, cos, sin)
        out = self.attention(index, q, k, v, cache, step)
        return layer.o_proj(out.reshape(T, c.num_heads * c.head_dim))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, head_dim] at the positions: rows of a table of every position below the
        highest seen, rounded up to 4,096 (4 MiB for Qwen3's head_dim). Computed per step (a cos
        and a sin of a few elements) they took 3.5% of a single-stream int4 step (py-spy)."""
        top = int(positions.max()) + 1 if positions.numel() else 0
        if top > self._rope_table[0].shape[0]:
            freqs = torch.arange(-(-top // 4096) * 4096).float()[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope_table = (emb.cos(), emb.sin())
        return tuple(t.index_select(0, positions) for t in self._rope_table)
