"""The gated delta rule (Yang, Kautz and Hatamizadeh, "Gated Delta Networks", 2024) in float32
torch ops, and the causal convolution in front of it.

Per head, with decay a_t = exp(g_t) and write strength beta_t, the state S [key_dim, value_dim]
follows S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T and the output is S_t^T q_t.
A decode step applies that once (``recurrent_step``). A prefill chunk of n tokens goes in blocks
of ``block`` tokens (``chunked``): inside a block, with G the cumulative sum of g, the writes the
rule makes solve one unit lower-triangular system, (I + A) U' = beta (V - exp(G) K S_0) with
A_ij = beta_i (k_i . k_j) exp(G_i - G_j) for j < i, so a block costs a few matrix products
instead of one rank-1 update per token; then
  O = exp(G) Q S_0 + [(Q K^T) exp(G_i - G_j)]_{j <= i} U'
  S = exp(G_n) S_0 + (exp(G_n - G) K)^T U'.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

DEFAULT_BLOCK = 64  # tokens per block of the chunked form until delta_block.py has timed this CPU
# (system [H, n, n], rhs [H, n, c]) -> (I + the strictly lower triangle of system)^-1 rhs; it may
# overwrite rhs (the C++ one does: gated_deltanet.kernel_solve)
Solve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def solve_in_torch(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """The block's unit lower-triangular solve through LAPACK."""
    return torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)


def causal_conv(history: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's depthwise causal convolution then SiLU. history [taps - 1, C] are the
    inputs before these, inputs [n, C], weight [C, taps] (the last tap multiplies the current
    input) -> (outputs [n, C], the new history: the last taps - 1 inputs)."""
    window = torch.cat([history, inputs])
    out = F.conv1d(window.t().unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0].t()
    return F.silu(out), window[window.shape[0] - history.shape[0]:]


def causal_conv_step(history: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """causal_conv for one input per sequence: history [B, taps - 1, C], inputs [B, C]."""
    window = torch.cat([history, inputs.unsqueeze(1)], dim=1)  # [B, taps, C]
    out = torch.einsum("btc,ct->bc", window, weight)
    return F.silu(out), window[:, 1:]


def recurrent_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor) -> torch.Tensor:
    """One token per sequence: state [B, H, dk, dv] (updated in place), q, k [B, H, dk], v [B, H, dv],
    g, beta [B, H] -> outputs [B, H, dv]."""
    state.mul_(g.exp()[..., None, None])
    predicted = torch.einsum("bhkv,bhk->bhv", state, k)
    state.add_(k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - predicted)).unsqueeze(-2))
    return torch.einsum("bhkv,bhk->bhv", state, q)


def chunked(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
            beta: torch.Tensor, block: int = DEFAULT_BLOCK, snapshots: Sequence[tuple[int, torch.Tensor]] = (),
            solve: Solve = solve_in_torch) -> torch.Tensor:
    """One sequence's n tokens: state [H, dk, dv] (updated in place), q, k [n, H, dk], v [n, H, dv],
    g, beta [n, H] -> outputs [n, H, dv]. snapshots: (count, into) pairs in increasing count,
    1 <= count <= n: the state after that many tokens is written into `into` [H, dk, dv] (where
    the caller keeps it, so nothing is copied twice). solve: each block's triangular solve."""
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [H, n, d]
    g, beta = g.t(), beta.t()  # [H, n]
    out = torch.empty_like(v)
    for first in range(0, q.shape[1], block):
        rows = slice(first, min(first + block, q.shape[1]))
        inside = [(count - first, into) for count, into in snapshots if first < count <= rows.stop]
        out[:, rows] = _block(state, q[:, rows], k[:, rows], v[:, rows], g[:, rows], beta[:, rows], inside, solve)
    return out.transpose(0, 1)


def _block(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor, snapshots: list[tuple[int, torch.Tensor]], solve: Solve) -> torch.Tensor:
    """One block; writes the states after each snapshot's count of its tokens: after j tokens,
    exp(G_j) S_0 + (exp(G_j - G_i) k_i)^T U'_i summed over i < j."""
    n = q.shape[1]
    cumulative = g.cumsum(-1)  # G [H, n]
    gaps = cumulative.unsqueeze(-1) - cumulative.unsqueeze(-2)  # G_i - G_j [H, n, n]
    lower = torch.ones(n, n, dtype=torch.bool).tril()
    decays = torch.where(lower, gaps, float("-inf")).exp()  # exp(G_i - G_j) for j <= i, else 0
    system = beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decays  # the diagonal is ignored below
    rhs = beta.unsqueeze(-1) * torch.cat([v, cumulative.exp().unsqueeze(-1) * k], dim=-1)
    solved = solve(system, rhs)
    writes = solved[..., :v.shape[-1]] - solved[..., v.shape[-1]:] @ state  # U' [H, n, dv]
    out = (cumulative.exp().unsqueeze(-1) * q) @ state + ((q @ k.transpose(-1, -2)) * decays) @ writes
    for j, into in snapshots:
        if j < n:
            at = cumulative[:, j - 1:j]
            torch.mul(state, at.exp().unsqueeze(-1), out=into)
            into.baddbmm_(((at - cumulative[:, :j]).exp().unsqueeze(-1) * k[:, :j]).transpose(-1, -2), writes[:, :j])
    last = cumulative[:, -1:]
    state.mul_(last.exp().unsqueeze(-1)).add_(((last - cumulative).exp().unsqueeze(-1) * k).transpose(-1, -2) @ writes)
    if snapshots and snapshots[-1][0] == n:
        snapshots[-1][1].copy_(state)
    return out
