"""Projections that read the same input as one matmul: q, k and v; gate and up.

At decode each projection is a stream of its weight from memory, and one long stream with one
thread hand-off is faster than three short ones: on a Zen 5 (2 threads, 4 Qwen3-0.6B layers,
``python benchmarks/bench_linears.py --merged``, three runs) a layer's projections at one row
took 1.09-1.31x less time merged in int4 and 0.96-1.18x in bfloat16, 1.01-1.17x at 8 rows,
about even from 16 rows on. vLLM merges the same projections
(QKVParallelLinear, MergedColumnParallelLinear) for the same reason. Each part is quantized on its
own first (with its own calibration statistics), so merging changes no weight.
"""
from __future__ import annotations

from typing import Sequence

import torch

from qwen_serve.quant import int4


class MergedLinear:
    """The parts' rows stacked into one layer of the parts' type; a call returns each part's
    output, as column slices of the stacked one (rows at a stride)."""

    def __init__(self, names: Sequence[str], parts: Sequence) -> None:
        kinds = {type(part) for part in parts}
        if len(kinds) != 1 or len({part.in_features for part in parts}) != 1:
            raise TypeError(f"cannot merge {list(names)}: parts differ in type or input width")
        self.names = tuple(names)
        self.sizes = [part.out_features for part in parts]
        self.linear = kinds.pop().stacked(parts)  # whose weight calibration watches, for every name

    @classmethod
    def from_weights(cls, names: Sequence[str], weights: Sequence, biases: Sequence, make_linear) -> "MergedLinear":
        """The parts as loaded (make_linear turns one into a layer). int4 parts in the canonical
        format are stacked before the one layer is made: made apart, each would be reordered
        into the kernels' layout, back, and again once stacked (a third of a 30B-A3B load)."""
        if not all(isinstance(weight, int4.Int4Weight) for weight in weights):
            return cls(names, [make_linear(weight, bias) for weight, bias in zip(weights, biases)])
        merged = cls.__new__(cls)
        merged.names, merged.sizes = tuple(names), [weight.shape[0] for weight in weights]
        merged.linear = make_linear(int4.concatenate(list(weights)), concatenated_bias(biases, merged.sizes))
        return merged

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(x).split(self.sizes, dim=-1)


def stacked_bias(parts: Sequence) -> torch.Tensor | None:
    """The parts' biases end to end (zeros for a part without one), or None if none has one."""
    return concatenated_bias([part.bias for part in parts], [part.out_features for part in parts])


def concatenated_bias(biases: Sequence, sizes: Sequence[int]) -> torch.Tensor | None:
    if all(bias is None for bias in biases):
        return None
    return torch.cat([torch.zeros(size) if bias is None else bias.float() for bias, size in zip(biases, sizes)])
