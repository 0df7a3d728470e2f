"""Every decoder layer of a step without prefill chunks in one kernel call (``decode_layers_`` in
kernels/ops.cpp), for models whose projections all run the AVX-512 kernels on their blocked
layouts (int4, or bfloat16 where the CPU has no AMX; a mixture's experts int4 with VNNI) over the
backend's own paged KV storage and, for Gated DeltaNet layers, its own state storage: decode and
the verification of drafts, where the ~11 calls per layer (a mixture of experts: ~8 more) and the
Python around them took about a seventh of a Qwen3-0.6B step and more of a Qwen3.5-0.8B one
(py-spy, Zen 4). The op runs the same kernels in the same order as the per-op path of model.py,
so both give the same bits (a drafted chunk's rows write their states straight into the slots
the per-op path copies them to, with the same arithmetic); any other step (a prefill chunk, a cache
read through the Protocols, a watched projection, a row count for which a plan takes tiles) keeps
the per-op path.
"""
from __future__ import annotations

from functools import partial

import torch

from .decoder_layer import AttentionLayer, DenseMLPLayer, SparseMoELayer
from .gated_deltanet import GatedDeltaNetLayer
from .int4_linear import Int4Linear
from .linear import DenseLinear
from .native import Kernels
from .state_storage import TorchStateStorage

ATTENTION, GATED_DELTA = 0, 1  # the op's mixer kinds
DENSE, EXPERTS = 0, 1  # and MLP kinds


class FusedDecode:
    def __init__(self, layers: list, kernels: Kernels) -> None:
        self.kernels = kernels
        self.layers = layers
        self.linears = [_watched(layer) for layer in layers]
        # the projections' plans (read per step, as the layers read them; a model sets them after
        # this is built) say at how many rows the kernels run them, which is what the op does. A
        # layer's experts are all of one shape, so of one plan: the first one's stand for them
        self.planned = [lin for lins in self.linears for lin in lins
                        if isinstance(lin, Int4Linear) or isinstance(lin, DenseLinear) and lin.plan is not None]
        self.planned += [lin for layer in layers if type(layer.mlp) is SparseMoELayer
                         for lin in layer.mlp.experts[0].linears()]
        self.mixers = [ATTENTION if type(layer.mixer) is AttentionLayer else GATED_DELTA for layer in layers]
        self.mlps = [EXPERTS if type(layer.mlp) is SparseMoELayer else DENSE for layer in layers]
        moe = [layer.mlp for layer in layers if type(layer.mlp) is SparseMoELayer]
        kind = moe[0].kind if moe else None
        self.routing = (kind.top_k, kind.normalize_top_k, kind.intermediate_size) if kind else (0, False, 0)
        attentions = [layer.mixer for layer, kind in zip(layers, self.mixers) if kind == ATTENTION]
        deltas = [layer.mixer for layer, kind in zip(layers, self.mixers) if kind == GATED_DELTA]
        self.key_heads = deltas[0].kind.num_key_heads if deltas else 0
        self.output_gate = bool(attentions) and attentions[0].output_gate
        # the decoder's KV and state layers come first in the storages (a draft head's follow)
        self.attention_layers, self.delta_layers = len(attentions), len(deltas)
        none = torch.empty(0)
        self.weights, self.tables = [], []
        for layer in layers:
            mixer = layer.mixer
            if type(mixer) is AttentionLayer:
                q_norm, k_norm = (none if t is None else t for t in (mixer.q_norm, mixer.k_norm))
                mixed = [*_blocks(mixer.qkv.linear, none), q_norm, k_norm, *_blocks(mixer.o_proj, none)]
            else:
                mixed = [*_blocks(mixer.in_proj.linear, none), mixer.gates.blocked, mixer.conv_by_tap,
                         mixer.decay_rate, mixer.dt_bias, mixer.out_norm, *_blocks(mixer.out_proj, none)]
            mlp_at = len(self.weights) + 2 + len(mixed)
            self.weights += [layer.input_norm, *mixed, layer.post_norm, *_mlp_tensors(layer.mlp, none)]
            if type(layer.mlp) is SparseMoELayer:  # after the router, the experts' table: fetched per call
                self.tables.append((mlp_at + 1, layer.mlp.fused))
        self.no_states = (none.long(), none.bool())

    @classmethod
    def for_layers(cls, layers: list, kernels: Kernels | None) -> "FusedDecode | None":
        """The fused path when every layer is attention or Gated DeltaNet + a dense MLP or a
        mixture of experts (what the op computes), the attention layers alike in their output
        gate, the experts' layers in their routing, and every projection a blocked int4 or bf16
        layer without bias (a Gated DeltaNet layer's gates, a router and a shared expert's gate:
        the float32 kernel's; the experts: int4 in one VNNI call, fused_experts.py), else None."""
        if kernels is None or kernels.isa != "avx512":
            return None
        if not all(type(layer.mixer) in (AttentionLayer, GatedDeltaNetLayer) and
                   type(layer.mlp) in (DenseMLPLayer, SparseMoELayer) for layer in layers):
            return None
        if len({layer.mixer.output_gate for layer in layers if type(layer.mixer) is AttentionLayer}) > 1:
            return None
        moe = [layer.mlp for layer in layers if type(layer.mlp) is SparseMoELayer]
        if len({(mlp.kind.top_k, mlp.kind.normalize_top_k, mlp.kind.intermediate_size, mlp.kind.num_experts,
                 mlp.kind.shared_expert_size) for mlp in moe}) > 1:
            return None
        for layer in layers:
            projections = layer.mixer.linears()[:2]
            f32_gates = [layer.mixer.gates] if type(layer.mixer) is GatedDeltaNetLayer else []
            if type(layer.mlp) is SparseMoELayer:
                mlp = layer.mlp
                if mlp.fused is None:
                    return None
                f32_gates += [mlp.router] + ([mlp.shared_gate] if mlp.shared is not None else [])
                projections += mlp.shared.linears() if mlp.shared is not None else []
            else:
                projections += layer.mlp.linears()
            if any(gates.bias is not None or gates.kernels is not kernels or not gates.blocked_f32
                   for gates in f32_gates):
                return None
            for linear in projections:
                if linear.bias is not None or linear.kernels is not kernels:
                    return None
                if not (type(linear) is Int4Linear and linear.blocked or
                        type(linear) is DenseLinear and linear.blocked is not None and not linear.blocked_f32):
                    return None
        return cls(layers, kernels)

    def applies(self, rows: int, step, cache) -> bool:
        """Whether this step may take the fused path: every row decodes and reads the cache (and
        keeps its states) in place, the kernels take this many rows, and no projection is being
        watched (calibration swaps a layer's attribute for a recorder)."""
        return step.paged is not None and not step.prefills and \
            (not self.delta_layers or type(getattr(cache, "state_storage", None)) is TorchStateStorage) and \
            all(lin.plan.path(rows) == "kernel" for lin in self.planned) and \
            all(_watched(layer) == linears for layer, linears in zip(self.layers, self.linears))

    def __call__(self, hidden: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step, cache,
                 config, scale: float) -> torch.Tensor:
        """hidden [T, E] (updated in place to the residual before the last MLP), x its first
        RMSNorm -> the last layer's MLP output."""
        paged = step.paged
        for index, experts in self.tables:  # rebuilt if the experts' tensors moved
            self.weights[index] = experts.table()
        conv_states, states = [], []
        state_slots, fresh = self.no_states
        order = (self.no_states[0],) * 4
        if self.delta_layers:
            storage = cache.state_storage
            conv_states, states = storage.conv_history[:self.delta_layers], storage.recurrent[:self.delta_layers]
            state_slots, fresh = step.states.slots, step.states.fresh
            if not step.states.decoding or step.states.steps[0].copies:  # drafts, or snapshots to keep
                state_slots, fresh, order = stepping_order(step.states)
        return self.kernels.ops.decode_layers_(
            hidden, x, self.mixers, self.mlps, self.weights, paged.storage.keys[:self.attention_layers],
            paged.storage.values[:self.attention_layers], conv_states, states,
            cos, sin, step.write_slots, paged.block_tables, paged.lengths, state_slots, fresh, *order,
            paged.storage.block_size, config.num_heads, config.num_kv_heads, config.head_dim, self.output_gate,
            self.key_heads, *self.routing, config.rms_norm_eps, scale, self.kernels.vnni, self.kernels.bf16)


def stepping_order(layout) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """A step with drafted chunks as the op takes it, from gated_deltanet.StateLayout's steps: the
    rows in stepping order, their state slots and fresh flags in that order, where each step
    starts among them, the (from, to) state slots copied after the steps and where each step's
    copies start."""
    steps = layout.steps
    step_starts, copy_starts, copies = [0], [0], []
    for step_rows in steps:
        step_starts.append(step_starts[-1] + len(step_rows.rows))
        copies += [(int(layout.slots[chunk]), slot) for chunk, slot in step_rows.copies]
        copy_starts.append(len(copies))
    slots = torch.cat([layout.slots[step_rows.chunks] for step_rows in steps])
    fresh = torch.cat([step_rows.fresh for step_rows in steps])
    order = torch.cat([step_rows.rows for step_rows in steps])
    as_long = partial(torch.tensor, dtype=torch.long)
    return slots, fresh, (order, as_long(step_starts), as_long(copies).view(-1, 2), as_long(copy_starts))


def _watched(layer) -> tuple:
    """The projections calibration may swap for a recorder (which the op would not see): every
    one of the layer's, but a mixture's experts, which fused_experts.py reads through their
    addresses on either path."""
    mlp = layer.mlp
    if type(mlp) is not SparseMoELayer:
        return tuple(layer.linears())
    shared = ([mlp.shared_gate, *mlp.shared.linears()] if mlp.shared is not None else [])
    return (*layer.mixer.linears(), mlp.router, *shared)


def _mlp_tensors(mlp, none: torch.Tensor) -> list[torch.Tensor]:
    """A dense MLP's gate/up and down blocks; a mixture's router, experts' table and shared expert
    (seven empties without one), as the op takes them after post_norm."""
    if type(mlp) is not SparseMoELayer:
        return [*_blocks(mlp.gate_up.linear, none), *_blocks(mlp.down_proj, none)]
    shared = [none] * 7
    if mlp.shared is not None:
        shared = [*_blocks(mlp.shared.gate_up.linear, none), *_blocks(mlp.shared.down_proj, none),
                  mlp.shared_gate.blocked]
    return [mlp.router.blocked, mlp.fused.table(), *shared]


def _blocks(linear, none: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection as the op takes it: int4 codes, scale, zero; or bf16 blocks and two empties."""
    if isinstance(linear, Int4Linear):
        return linear.codes, linear.scale, linear.zero
    return linear.blocked, none, none
