"""Every decoder layer of a decode-only step in one kernel call (``decode_layers_`` in
kernels/ops.cpp), for models whose projections all run the AVX-512 kernels on their blocked
layouts (int4, or bfloat16 where the CPU has no AMX) over the backend's own paged
KV storage: decode, where the ~11 calls per layer and the Python
around them took about a seventh of a Qwen3-0.6B step (py-spy, Zen 4). The op runs the same
kernels in the same order as the per-op path of model.py, so both give the same bits; any other
step (a prefill chunk, drafts, a cache read through the Protocols, a watched projection) keeps
the per-op path.
"""
from __future__ import annotations

import torch

from .decoder_layer import AttentionLayer, DenseMLPLayer
from .int4_linear import Int4Linear
from .linear import DenseLinear
from .native import Kernels


class FusedDecode:
    def __init__(self, layers: list, kernels: Kernels) -> None:
        self.kernels = kernels
        self.layers = layers
        self.linears = [tuple(layer.linears()) for layer in layers]
        # the int4 layers: their plans (read per step, as the layers read them; a model sets them
        # after this is built) say how many rows the kernels take; the bf16 kernel takes any number
        self.quantized = [lin for lins in self.linears for lin in lins if isinstance(lin, Int4Linear)]
        none = torch.empty(0)
        self.weights = []
        for layer in layers:
            qkv, o, gate_up, down = (_blocks(linear, none) for linear in layer.linears())
            q_norm, k_norm = (none if t is None else t for t in (layer.mixer.q_norm, layer.mixer.k_norm))
            self.weights += [layer.input_norm, *qkv, q_norm, k_norm, *o, layer.post_norm, *gate_up, *down]

    @classmethod
    def for_layers(cls, layers: list, kernels: Kernels | None) -> "FusedDecode | None":
        """The fused path when every layer is attention + dense MLP (what the op computes) and every
        projection a blocked int4 or bf16 layer without bias, else None."""
        if kernels is None or kernels.isa != "avx512":
            return None
        if not all(type(layer.mixer) is AttentionLayer and type(layer.mlp) is DenseMLPLayer for layer in layers):
            return None
        for layer in layers:
            for linear in layer.linears():
                if linear.bias is not None or linear.kernels is not kernels:
                    return None
                if not (type(linear) is Int4Linear and linear.blocked or
                        type(linear) is DenseLinear and linear.blocked is not None and not linear.blocked_f32):
                    return None
        return cls(layers, kernels)

    def applies(self, rows: int, step) -> bool:
        """Whether this step may take the fused path: every row decodes and reads the cache in
        place, the kernels take this many rows, and no projection is being watched (calibration
        swaps a layer's attribute for a recorder)."""
        return step.paged is not None and not step.prefills and \
            all(lin.plan.path(rows) == "kernel" for lin in self.quantized) and \
            all(tuple(layer.linears()) == linears for layer, linears in zip(self.layers, self.linears))

    def __call__(self, hidden: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step,
                 config, scale: float) -> torch.Tensor:
        """hidden [T, E] (updated in place to the residual before the last MLP), x its first
        RMSNorm -> the last layer's MLP output."""
        paged = step.paged
        return self.kernels.ops.decode_layers_(
            hidden, x, self.weights, paged.storage.keys, paged.storage.values, cos, sin, step.write_slots,
            paged.block_tables, paged.lengths, paged.storage.block_size, config.num_heads, config.num_kv_heads,
            config.rms_norm_eps, scale, self.kernels.vnni, self.kernels.bf16)


def _blocks(linear, none: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A projection as the op takes it: int4 codes, scale, zero; or bf16 blocks and two empties."""
    if isinstance(linear, Int4Linear):
        return linear.codes, linear.scale, linear.zero
    return linear.blocked, none, none
