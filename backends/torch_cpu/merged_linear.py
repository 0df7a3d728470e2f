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

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(x).split(self.sizes, dim=-1)


def stacked_bias(parts: Sequence) -> torch.Tensor | None:
    """The parts' biases end to end (zeros for a part without one), or None if none has one."""
    if all(part.bias is None for part in parts):
        return None
    return torch.cat([torch.zeros(part.out_features) if part.bias is None else part.bias for part in parts])
