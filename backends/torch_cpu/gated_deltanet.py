"""models.layers.GatedDeltaNet on torch: the projections as any layer's (int4, bf16 or float32;
in_proj_qkv and in_proj_z in one matmul), then per sequence the causal convolution and the gated
delta rule in float32 (delta_rule.py) from the state its slot holds, written back after.

Decoding sequences step together: one C++ call (kernels/delta_rule.cpp) that updates their states
where the backend's storage keeps them, or else batched torch ops through StateStorage.read and
write. A chunk that ends in speculative drafts steps the same way, a row per call, so verifying
computes what decoding would; the states a rewind may return to are copied out between calls.
Each prefill chunk runs the chunked form in torch ops."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from qwen_serve.kv.hybrid import chunk_snapshots
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.layers import GatedDeltaNet
from qwen_serve.protocols import RecurrentState, StepBatch

from . import delta_rule
from .layer_ops import LayerOps, float_rows, rms_norm
from .linear import DenseLinear
from .state_storage import TorchStateStorage

IN_PROJ = ("in_proj_qkv", "in_proj_z")


@dataclass
class DecodeStep:
    """One row of each stepping chunk (decodes, and the next row of each drafted chunk)."""

    chunks: torch.Tensor  # the chunks taking part
    rows: torch.Tensor  # their rows in the step
    fresh: torch.Tensor  # bool per chunk: its state starts at zeros
    copies: list[tuple[int, int]]  # (chunk, slot): after this row, the chunk's state is also kept in slot


@dataclass
class StateLayout:
    """Where each chunk of a step keeps its state: built once per step, read by every layer."""

    slots: torch.Tensor  # [chunks] each chunk's state slot
    fresh: torch.Tensor  # [chunks] bool: the chunk starts its sequence, so its state starts at zeros
    rows: list[slice]  # each chunk's rows in the step
    steps: list[DecodeStep]  # the stepping chunks' rows, in order
    chunked: list[int]  # the prefill chunks (more than one row, no drafts): the chunked form
    snapshots: list[list[tuple[int, int]]]  # each chunk's (rows in, slot): copy the state after that many rows
    decoding: bool  # every chunk is one row (the step is steps[0] alone, its rows in order)


def state_layout(batch: StepBatch, cache: RecurrentState) -> StateLayout:
    rows, first = [], 0
    for chunk in batch.chunks:
        rows.append(slice(first, first + len(chunk.token_ids)))
        first += len(chunk.token_ids)
    snapshots = [chunk_snapshots(cache, c) for c in batch.chunks]
    stepping = [i for i, c in enumerate(batch.chunks) if len(c.token_ids) == 1 or c.num_draft]
    chunked = [i for i, c in enumerate(batch.chunks) if len(c.token_ids) > 1 and not c.num_draft]
    steps = []
    for r in range(max((len(batch.chunks[i].token_ids) for i in stepping), default=0)):
        taking = [i for i in stepping if len(batch.chunks[i].token_ids) > r]
        steps.append(DecodeStep(
            chunks=torch.tensor(taking, dtype=torch.long),
            rows=torch.tensor([rows[i].start + r for i in taking], dtype=torch.long),
            fresh=torch.tensor([r == 0 and batch.chunks[i].start == 0 for i in taking], dtype=torch.bool),
            copies=[(i, slot) for i in taking for after, slot in snapshots[i] if after == r + 1]))
    return StateLayout(
        slots=torch.tensor([cache.state_slot(c.seq_id) for c in batch.chunks], dtype=torch.long),
        fresh=torch.tensor([c.start == 0 for c in batch.chunks], dtype=torch.bool),
        rows=rows,
        steps=steps,
        chunked=chunked,
        snapshots=snapshots,
        decoding=all(len(c.token_ids) == 1 for c in batch.chunks),
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
        # [2 * value heads, hidden], float32 through the float32 kernel once prepacked: a row's gates
        # do not depend on how many rows the step has (torch's GEMM would), so verifying drafts
        # computes what decoding would
        self.gates = DenseLinear(torch.cat([take("in_proj_a.weight"), take("in_proj_b.weight")]))
        # [taps, channels], each tap's weights contiguous as the kernels read them; in_torch_ops takes
        # the transposed view
        self.conv_by_tap = take("conv1d.weight").reshape(kind.conv_channels, kind.conv_kernel).t().contiguous()
        self.decay_rate = -take("A_log").exp()  # g = decay_rate * softplus(a + dt_bias)
        self.dt_bias = take("dt_bias")
        self.out_norm = take("norm.weight")
        self.block = delta_rule.DEFAULT_BLOCK  # the model sets it by timing (delta_block.py)

    def linears(self) -> list:
        return [self.in_proj.linear, self.out_proj, self.gates]

    def norms(self) -> list[torch.Tensor]:
        """The float tensors beside the linears, as weight_bytes counts them."""
        return [self.conv_by_tap, self.decay_rate, self.dt_bias, self.out_norm]

    def projections(self) -> Iterator[tuple[str, object, str]]:
        for name in self.in_proj.names:
            yield f"{self.prefix}.{name}.weight", self.in_proj, "linear"
        yield f"{self.prefix}.out_proj.weight", self, "out_proj"

    def __call__(self, index: int, x: torch.Tensor, cos, sin, cache: RecurrentState, step, config: ModelConfig,
                 ops: LayerOps, attention) -> torch.Tensor:
        kind, T, layout = self.kind, x.shape[0], step.states
        mixed, z = self.in_proj(x)  # column slices of one output
        gates = self.gates(x.float())  # [T, 2 * value heads]: a, then b
        storage, eps = cache.state_storage, config.rms_norm_eps
        in_kernel = ops.ops is not None and type(storage) is TorchStateStorage and float_rows(mixed, z)
        decode = partial(ops.ops.gated_delta_decode_, conv_weight=self.conv_by_tap, conv_state=storage.conv_history[index],
                         state=storage.recurrent[index], decay_rate=self.decay_rate, dt_bias=self.dt_bias,
                         norm_weight=self.out_norm, key_heads=kind.num_key_heads, eps=eps) if in_kernel else None
        if decode is not None and layout.decoding:  # row i is chunk i's one row: no gathers or scatters
            out = decode(mixed, z, slots=layout.slots, fresh=layout.fresh, gates=gates)
            copy_states(storage, index, layout, layout.steps[0])
            return self.out_proj(out)
        a, b = gates.split(kind.num_value_heads, dim=-1)
        g = self.decay_rate * F.softplus(a + self.dt_bias)  # [T, value heads], the log of each decay
        beta = torch.sigmoid(b)
        out = torch.empty(T, kind.num_value_heads * kind.value_dim)
        for step_rows in layout.steps:
            rows, slots = step_rows.rows, layout.slots[step_rows.chunks]
            if decode is not None:
                out[rows] = decode(mixed[rows], z[rows], slots=slots, fresh=step_rows.fresh, gates=gates[rows])
            else:
                out[rows] = in_torch_ops(kind, self.conv_by_tap.t(), self.out_norm, storage, index, slots, step_rows.fresh,
                                         mixed[rows], z[rows], g[rows], beta[rows], eps, chunked=False)
            copy_states(storage, index, layout, step_rows)
        for i in layout.chunked:
            rows = layout.rows[i]
            if in_kernel:
                out[rows] = chunk_in_kernel(kind, ops.ops, self.conv_by_tap, self.out_norm, storage, index,
                                            int(layout.slots[i]), bool(layout.fresh[i]), mixed[rows], z[rows],
                                            g[rows], beta[rows], eps, layout.snapshots[i], self.block)
            else:
                out[rows] = in_torch_ops(kind, self.conv_by_tap.t(), self.out_norm, storage, index, layout.slots[i:i + 1],
                                         layout.fresh[i:i + 1], mixed[rows], z[rows], g[rows], beta[rows], eps,
                                         chunked=True, snapshots=layout.snapshots[i], block=self.block)
        return self.out_proj(out)


def chunk_in_kernel(kind: GatedDeltaNet, kernels, conv_by_tap: torch.Tensor, out_norm: torch.Tensor,
                    storage: TorchStateStorage, index: int, slot: int, fresh: bool, mixed: torch.Tensor,
                    z: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, eps: float,
                    snapshots: Sequence[tuple[int, int]], block: int = delta_rule.DEFAULT_BLOCK) -> torch.Tensor:
    """in_torch_ops for one prefill chunk with the element-wise steps in C++ (the convolution, its
    SiLU and the q/k norms in one pass; the output's norm and gate in another) and the state updated
    where the storage keeps it: the torch form's copies and transposes around them took a fifth of a
    512-token prefill of Qwen3.5-0.8B on 2 Zen 3 cores."""
    histories, states = storage.conv_history[index], storage.recurrent[index]
    history, state = histories[slot], states[slot]
    if fresh:
        history.zero_()
        state.zero_()
    for rows, into in snapshots:  # the history after each snapshot's rows, before the kernel moves it on
        history_after(history, mixed, rows, histories[into])
    convolved = kernels.gated_delta_conv_(mixed, conv_by_tap, history, kind.num_key_heads, kind.key_dim)
    q, k, v = heads_of(kind, convolved)
    out = delta_rule.chunked(state, q, k, v, g, beta, block, [(rows, states[into]) for rows, into in snapshots],
                             kernel_solve(kernels)).reshape(mixed.shape[0], -1)
    kernels.gated_delta_gate_(out, z, out_norm, eps)
    return out


def copy_states(storage, index: int, layout: StateLayout, step_rows: DecodeStep) -> None:
    """After a step's rows, layer `index`'s states that step_rows.copies keeps (states a rewind may
    return to, or prefix-cache snapshots) copied into their slots."""
    if step_rows.copies:
        held = storage.read(index, layout.slots[[chunk for chunk, _ in step_rows.copies]])
        storage.write(index, torch.tensor([slot for _, slot in step_rows.copies]), *held)


def kernel_solve(kernels) -> delta_rule.Solve:
    """The chunked rule's triangular solve by the C++ operator (torch.ops.qwen_serve), in place
    where rhs is contiguous (a product with the transposed beta may come out in another order)."""
    def solve(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        rhs = rhs.contiguous()
        kernels.unit_lower_solve_(system.contiguous(), rhs)
        return rhs
    return solve


def history_after(history: torch.Tensor, inputs: torch.Tensor, rows: int, into: torch.Tensor) -> None:
    """The convolution's history [taps - 1, C] after `rows` of inputs [n, C] that followed history,
    written into `into`: the last taps - 1 of history's rows and the inputs' first `rows`."""
    kept = history.shape[0]
    from_history = max(kept - rows, 0)
    into[:from_history] = history[kept - from_history:]
    into[from_history:] = inputs[rows - (kept - from_history):rows]


def heads_of(kind: GatedDeltaNet, convolved: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The convolution's output [T, C] as q, k [T, value heads, key_dim] (each key head serving
    value heads / key heads of them) and v [T, value heads, value_dim]."""
    T, key_width = convolved.shape[0], kind.num_key_heads * kind.key_dim
    q, k, v = convolved.split([key_width, key_width, kind.num_value_heads * kind.value_dim], dim=-1)
    group = kind.num_value_heads // kind.num_key_heads
    q, k = (t.reshape(T, kind.num_key_heads, kind.key_dim) for t in (q, k))
    if group > 1:
        q, k = (t.repeat_interleave(group, dim=1) for t in (q, k))
    return q, k, v.reshape(T, kind.num_value_heads, kind.value_dim)


def in_torch_ops(kind: GatedDeltaNet, conv: torch.Tensor, out_norm: torch.Tensor, storage, index: int,
                 slots: torch.Tensor, fresh: torch.Tensor, mixed: torch.Tensor, z: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, eps: float, chunked: bool, snapshots: Sequence[tuple[int, int]] = (),
                 block: int = delta_rule.DEFAULT_BLOCK) -> torch.Tensor:
    """What the layer computes between its projections, in torch ops through StateStorage.read and
    write: one chunk of one sequence (chunked), or one row each of len(slots) sequences ->
    [rows, value heads * value_dim]. conv [channels, taps], out_norm [value_dim]. snapshots: for a
    chunk, (rows, slot) pairs: the state after that many of its rows is also written to slot."""
    history, state = storage.read(index, slots)
    if bool(fresh.any()):
        history[fresh], state[fresh] = 0, 0
    if chunked:
        mixed = mixed.float()
        windows = torch.empty(len(snapshots), *history.shape[1:])
        for into, (rows, _) in zip(windows, snapshots):
            history_after(history[0], mixed, rows, into)
        convolved, history[0] = delta_rule.causal_conv(history[0], mixed, conv)
    else:
        convolved, history = delta_rule.causal_conv_step(history, mixed.float(), conv)
    T = convolved.shape[0]
    q, k, v = heads_of(kind, convolved)
    q, k = unit_rows(q) * kind.key_dim ** -0.5, unit_rows(k)
    if chunked:
        taken = torch.empty(len(snapshots), *state.shape[1:])
        out = delta_rule.chunked(state[0], q, k, v, g, beta, block,
                                 [(rows, into) for (rows, _), into in zip(snapshots, taken)])
        if snapshots:
            storage.write(index, torch.tensor([slot for _, slot in snapshots]), windows, taken)
    else:
        out = delta_rule.recurrent_step(state, q, k, v, g, beta)
    storage.write(index, slots, history, state)
    gate = F.silu(z.float().reshape(T, kind.num_value_heads, kind.value_dim))
    return (rms_norm(out, out_norm, eps) * gate).reshape(T, -1)


def unit_rows(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each vector over the last dimension divided by its L2 norm (eps inside the root)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)
