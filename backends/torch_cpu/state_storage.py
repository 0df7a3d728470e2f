"""The recurrent state of every linear-attention layer (protocols.StateStorage), one row per slot:
float32 convolution histories (conv_history) [slots, taps, channels] and states [slots, heads, key_dim,
value_dim]. Every slot is reserved up front but uninitialized (torch.empty): the OS backs a page
only once a slot is first written, so a server that runs two sequences holds two sequences'
states, and nothing is copied as more slots come into use (growing by doubling did: on 2 Zen 3
cores the first 1,024-token prompt of Qwen3.5-0.8B took 4.4 s more in copies and zero fills than
the next). A slot is written before it is read (a fresh sequence starts from zeros, a snapshot
is filled as it is taken). Every change runs in inference mode, wherever it is called from (the
executor's step, or the cache's fork and prefix hit)."""
from __future__ import annotations

import torch

from qwen_serve.models.layers import GatedDeltaNet


class TorchStateStorage:
    def __init__(self, layers: list[GatedDeltaNet], max_slots: int) -> None:
        self.max_slots = max_slots
        self.conv_history = [torch.empty((max_slots, *kind.state_shapes()[0])) for kind in layers]
        self.recurrent = [torch.empty((max_slots, *kind.state_shapes()[1])) for kind in layers]
        self._touched = 0  # slots below this have been handed out at some time

    def ensure_slots(self, num_slots: int) -> None:
        if num_slots > self.max_slots:
            raise ValueError(f"state slot {num_slots - 1} is past the {self.max_slots} this storage holds")
        self._touched = max(self._touched, num_slots)

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
        """The slots handed out so far (what the OS has had to back), not the reservation."""
        return self._touched * self.bytes_per_slot()

    def bytes_per_slot(self) -> int:
        return sum(t.shape[1:].numel() * t.element_size() for t in (*self.conv_history, *self.recurrent))
