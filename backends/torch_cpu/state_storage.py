"""The recurrent state of every linear-attention layer (protocols.StateStorage), one row per slot:
float32 convolution histories (conv_history) [slots, taps, channels] and states [slots, heads, key_dim,
value_dim]. It grows by doubling when a slot past its end is first taken, so a server that runs
two sequences holds two sequences' states. Every change runs in inference mode, wherever it is
called from (the executor's step, or the cache's fork and prefix hit), since the tensors grow
in either."""
from __future__ import annotations

import torch

from qwen_serve.models.layers import GatedDeltaNet


class TorchStateStorage:
    def __init__(self, layers: list[GatedDeltaNet], max_slots: int) -> None:
        self.max_slots = max_slots
        self.conv_history = [torch.zeros((0, *kind.state_shapes()[0])) for kind in layers]
        self.recurrent = [torch.zeros((0, *kind.state_shapes()[1])) for kind in layers]

    @property
    def num_slots(self) -> int:
        return self.conv_history[0].shape[0] if self.conv_history else 0

    @torch.inference_mode()
    def ensure_slots(self, num_slots: int) -> None:
        if num_slots > self.max_slots:
            raise ValueError(f"state slot {num_slots - 1} is past the {self.max_slots} this storage holds")
        if num_slots <= self.num_slots:
            return
        grown = min(self.max_slots, max(num_slots, 2 * self.num_slots))
        for tensors in (self.conv_history, self.recurrent):
            for i, old in enumerate(tensors):
                tensors[i] = torch.cat([old, old.new_zeros((grown - old.shape[0], *old.shape[1:]))])

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv_history[layer].index_select(0, slots), self.recurrent[layer].index_select(0, slots)

    @torch.inference_mode()
    def write(self, layer: int, slots: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self.conv_history[layer].index_copy_(0, slots, conv)
        self.recurrent[layer].index_copy_(0, slots, recurrent)

    @torch.inference_mode()
    def copy_slot(self, src: int, dst: int) -> None:
        for tensors in (self.conv_history, self.recurrent):
            for t in tensors:
                t[dst] = t[src]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv_history, *self.recurrent))

    def bytes_per_slot(self) -> int:
        return sum(t.shape[1:].numel() * t.element_size() for t in (*self.conv_history, *self.recurrent))
