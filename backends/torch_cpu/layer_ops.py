"""The element-wise steps of a decoder layer: one fused C++ pass each (kernels/fused.cpp) where
the kernels are built, the same arithmetic in torch ops elsewhere.

At single-stream decode the torch form of these steps (five to fifteen small ops each: RMSNorm,
the residual add, Qwen3's per-head q/k norm, the rotary embedding, SiLU * up) cost more in
dispatch than in arithmetic; fused, they are four calls per layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .native import Kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _fusable(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def float_rows(*tensors: torch.Tensor) -> bool:
    """Rows at a stride of their own, each contiguous, none overlapping: the column slices of a
    merged projection's output (what the kernels' check_strided_rows accepts)."""
    for t in tensors:
        if t.dtype != torch.float32 or t.dim() < 2:
            return False
        row = 1
        for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
            if size != 1 and stride != row:
                return False
            row *= size
        if t.shape[0] > 1 and t.stride(0) < row:
            return False
    return True


class LayerOps:
    def __init__(self, kernels: Kernels | None) -> None:
        self.ops = None if kernels is None else kernels.ops

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.ops is not None and _fusable(x):
            return self.ops.rms_norm(x, weight, eps)
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden + delta, its RMSNorm); the fused pass adds into hidden in place."""
        if self.ops is not None and _fusable(hidden, delta):
            return hidden, self.ops.add_rms_norm_(hidden, delta, weight, eps)
        hidden = hidden + delta
        return hidden, rms_norm(hidden, weight, eps)

    def head_norm_rope(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float, cos: torch.Tensor,
                       sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D]: RMSNorm per head (when weight is given), then the rotary embedding at
        the positions whose cos and sin are [T, R], on the first R dimensions of each head (R < D:
        partial rotary, the rest passes). x may be a column slice (rows at a stride)."""
        rotary = cos.shape[-1]
        if self.ops is not None and rotary % 2 == 0 and float_rows(x) and _fusable(cos, sin):
            self.ops.head_norm_rope_(x, weight, eps, cos, sin)
            return x
        if weight is not None:
            x = rms_norm(x, weight, eps)
        turned = x[..., :rotary]
        turned = turned * cos[:, None, :] + rotate_half(turned) * sin[:, None, :]
        return turned if rotary == x.shape[-1] else torch.cat([turned, x[..., rotary:]], dim=-1)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """gate, up [T, n], each may be a column slice (the halves of a merged gate/up output)."""
        if self.ops is not None and gate.dim() == 2 and float_rows(gate, up):
            return self.ops.silu_mul(gate, up)
        return F.silu(gate) * up

    def sigmoid_mul(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x * sigmoid(gate) for x [T, n] and gate [T, n] (a column slice may be): the fused pass
        writes into x."""
        if self.ops is not None and x.dim() == 2 and _fusable(x) and float_rows(gate):
            self.ops.sigmoid_mul_(x, gate)
            return x
        return x * torch.sigmoid(gate)

    def route_top_k(self, logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) [T, top_k] for router logits [T, n]: the top_k experts by softmax
        probability, most probable first, their probabilities renormalized to sum to 1 when
        `normalize`; float32. The fused pass is the one decode_layers_ routes with."""
        if self.ops is not None and _fusable(logits) and logits.dim() == 2:
            return self.ops.moe_route(logits, top_k, normalize)
        weights, chosen = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
        return (weights / weights.sum(dim=-1, keepdim=True) if normalize else weights), chosen

    def add_sigmoid_gated(self, out: torch.Tensor, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """out + sigmoid(gate) * x for out, x [T, n] and gate [T, 1] (a shared expert and its
        gate); the fused pass adds into out."""
        if self.ops is not None and out.dim() == 2 and _fusable(out, x) and float_rows(gate):
            self.ops.add_sigmoid_gated_(out, x, gate)
            return out
        return out + torch.sigmoid(gate) * x
