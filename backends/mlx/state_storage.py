"""The recurrent state of every linear-attention layer on MLX (protocols.StateStorage), one row
per slot, float32: convolution histories [slots, taps, channels] and states [slots, heads,
key_dim, value_dim]. Grows by doubling when a slot past its end is first taken, like the torch
backend's; each write is evaluated at once, so no slot holds a lazy graph across steps."""
from __future__ import annotations

import math
from typing import Sequence

from qwen_serve.models.layers import GatedDeltaNet

from .mx import mx


class MLXStateStorage:
    def __init__(self, layers: list[GatedDeltaNet], max_slots: int) -> None:
        self.max_slots = max_slots
        self.conv_history = [mx.zeros((0, *kind.state_shapes()[0])) for kind in layers]
        self.recurrent = [mx.zeros((0, *kind.state_shapes()[1])) for kind in layers]

    @property
    def num_slots(self) -> int:
        return self.conv_history[0].shape[0] if self.conv_history else 0

    def ensure_slots(self, num_slots: int) -> None:
        if num_slots > self.max_slots:
            raise ValueError(f"state slot {num_slots - 1} is past the {self.max_slots} this storage holds")
        if num_slots <= self.num_slots:
            return
        grown = min(self.max_slots, max(num_slots, 2 * self.num_slots))
        for arrays in (self.conv_history, self.recurrent):
            for i, old in enumerate(arrays):
                arrays[i] = mx.concatenate([old, mx.zeros((grown - old.shape[0], *old.shape[1:]))])
        mx.eval(self.conv_history, self.recurrent)

    def read(self, layer: int, slots: Sequence[int]) -> tuple[mx.array, mx.array]:
        index = mx.array(list(slots), dtype=mx.int32)
        return self.conv_history[layer][index], self.recurrent[layer][index]

    def write(self, layer: int, slots: Sequence[int], conv: mx.array, recurrent: mx.array) -> None:
        index = mx.array(list(slots), dtype=mx.int32)
        self.conv_history[layer][index] = conv
        self.recurrent[layer][index] = recurrent
        mx.eval(self.conv_history[layer], self.recurrent[layer])

    def copy_slot(self, src: int, dst: int) -> None:
        for arrays in (self.conv_history, self.recurrent):
            for array in arrays:
                array[dst] = array[src]
        mx.eval(self.conv_history, self.recurrent)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.conv_history, *self.recurrent))

    def bytes_per_slot(self) -> int:
        return sum(4 * math.prod(a.shape[1:]) for a in (*self.conv_history, *self.recurrent))
