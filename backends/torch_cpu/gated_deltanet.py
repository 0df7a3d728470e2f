"""models.layers.GatedDeltaNet on torch: the projections as any layer's (int4, bf16 or float32;
in_proj_qkv and in_proj_z in one matmul), then per sequence the causal convolution and the gated
delta rule in float32 (delta_rule.py) from the state its slot holds, written back after.

Decoding sequences step together (one batched update); each prefill chunk runs the chunked form."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from qwen_serve.models.config import ModelConfig
from qwen_serve.models.layers import GatedDeltaNet
from qwen_serve.protocols import RecurrentState, StepBatch

from . import delta_rule
from .layer_ops import LayerOps, rms_norm

IN_PROJ = ("in_proj_qkv", "in_proj_z")
DELTA_RULE_BLOCK = 64  # tokens per block of the chunked form


@dataclass
class StateLayout:
    """Where each chunk of a step keeps its state: built once per step, read by every layer."""

    slots: torch.Tensor  # [chunks] each chunk's state slot
    fresh: torch.Tensor  # [chunks] bool: the chunk starts its sequence, so its state starts at zeros
    rows: list[slice]  # each chunk's rows in the step
    decodes: torch.Tensor  # indices of the one-row chunks
    decode_rows: torch.Tensor  # their rows


def state_layout(batch: StepBatch, cache: RecurrentState) -> StateLayout:
    rows, first = [], 0
    for chunk in batch.chunks:
        rows.append(slice(first, first + len(chunk.token_ids)))
        first += len(chunk.token_ids)
    decodes = [i for i, r in enumerate(rows) if r.stop - r.start == 1]
    return StateLayout(
        slots=torch.tensor([cache.state_slot(c.seq_id) for c in batch.chunks], dtype=torch.long),
        fresh=torch.tensor([c.start == 0 for c in batch.chunks], dtype=torch.bool),
        rows=rows,
        decodes=torch.tensor(decodes, dtype=torch.long),
        decode_rows=torch.tensor([rows[i].start for i in decodes], dtype=torch.long),
    )


class GatedDeltaNetLayer:
    def __init__(self, kind: GatedDeltaNet, weights) -> None:
        self.kind = kind
        self.prefix = f"{weights.prefix}.{kind.prefix}"
        tensors, hidden = weights.tensors, weights.tensors.shape(f"{self.prefix}.in_proj_qkv.weight")[-1]
        value_width = kind.num_value_heads * kind.value_dim
        tensors.check_shapes({
            f"{self.prefix}.in_proj_qkv.weight": (kind.conv_channels, hidden),
            f"{self.prefix}.in_proj_z.weight": (value_width, hidden),
            f"{self.prefix}.in_proj_a.weight": (kind.num_value_heads, hidden),
            f"{self.prefix}.in_proj_b.weight": (kind.num_value_heads, hidden),
            f"{self.prefix}.out_proj.weight": (hidden, value_width),
            f"{self.prefix}.conv1d.weight": (kind.conv_channels, 1, kind.conv_kernel),
            f"{self.prefix}.A_log": (kind.num_value_heads,),
            f"{self.prefix}.dt_bias": (kind.num_value_heads,),
            f"{self.prefix}.norm.weight": (kind.value_dim,),
        })
        self.in_proj = weights.merged(kind.prefix, IN_PROJ, ())
        self.out_proj = weights.linear(kind.prefix, "out_proj", False)
        take = lambda name: tensors.take(f"{self.prefix}.{name}").float()  # noqa: E731
        self.gates = torch.cat([take("in_proj_a.weight"), take("in_proj_b.weight")])  # [2 * value heads, hidden]
        self.conv = take("conv1d.weight").reshape(kind.conv_channels, kind.conv_kernel)
        self.decay_rate = -take("A_log").exp()  # g = decay_rate * softplus(a + dt_bias)
        self.dt_bias = take("dt_bias")
        self.out_norm = take("norm.weight")

    def linears(self) -> list:
        return [self.in_proj.linear, self.out_proj]

    def norms(self) -> list[torch.Tensor]:
        """The float tensors beside the linears, as weight_bytes counts them."""
        return [self.gates, self.conv, self.decay_rate, self.dt_bias, self.out_norm]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for name in self.in_proj.names:
            yield f"{self.prefix}.{name}.weight", self.in_proj, "linear"
        yield f"{self.prefix}.out_proj.weight", self, "out_proj"

    def __call__(self, index: int, x: torch.Tensor, cos, sin, cache: RecurrentState, step, config: ModelConfig,
                 ops: LayerOps, attention) -> torch.Tensor:
        kind, T = self.kind, x.shape[0]
        heads, key_heads = kind.num_value_heads, kind.num_key_heads
        mixed, z = self.in_proj(x)
        a, b = F.linear(x.float(), self.gates).split(heads, dim=-1)
        g = self.decay_rate * F.softplus(a + self.dt_bias)  # [T, heads], log of the decay
        beta = torch.sigmoid(b)
        layout: StateLayout = step.states
        history, state = cache.state_storage.read(index, layout.slots)
        history[layout.fresh] = 0
        state[layout.fresh] = 0
        convolved = torch.empty(T, kind.conv_channels)
        if layout.decodes.numel():
            convolved[layout.decode_rows], history[layout.decodes] = delta_rule.causal_conv_step(
                history[layout.decodes], mixed[layout.decode_rows].float(), self.conv)
        prefills = [i for i, rows in enumerate(layout.rows) if rows.stop - rows.start > 1]
        for i in prefills:
            convolved[layout.rows[i]], history[i] = delta_rule.causal_conv(history[i], mixed[layout.rows[i]].float(),
                                                                           self.conv)
        q, k, v = convolved.split([key_heads * kind.key_dim, key_heads * kind.key_dim, heads * kind.value_dim], dim=-1)
        q, k = (unit_rows(t.reshape(T, key_heads, kind.key_dim)).repeat_interleave(heads // key_heads, dim=1)
                for t in (q, k))
        q = q * kind.key_dim ** -0.5
        v = v.reshape(T, heads, kind.value_dim)
        out = torch.empty_like(v)
        if layout.decodes.numel():
            rows, decoding = layout.decode_rows, state[layout.decodes]
            out[rows] = delta_rule.recurrent_step(decoding, q[rows], k[rows], v[rows], g[rows], beta[rows])
            state[layout.decodes] = decoding
        for i in prefills:
            rows = layout.rows[i]
            out[rows] = delta_rule.chunked(state[i], q[rows], k[rows], v[rows], g[rows], beta[rows], DELTA_RULE_BLOCK)
        cache.state_storage.write(index, layout.slots, history, state)
        gated = rms_norm(out, self.out_norm, config.rms_norm_eps) * F.silu(z.float().reshape(T, heads, kind.value_dim))
        return self.out_proj(gated.reshape(T, heads * kind.value_dim))


def unit_rows(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each vector over the last dimension divided by its L2 norm (eps inside the root)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)
