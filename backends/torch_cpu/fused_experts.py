"""A mixture-of-experts layer's experts in one C++ call (torch.ops.qwen_serve.q4b_moe_vnni8).

Run one by one from Python (decoder_layer.run_experts_grouped), each active expert costs two
kernel calls and the Python around them: 8 experts x 48 layers of Qwen3-30B-A3B are ~800 calls
per decoded token. One call per layer sorts the step's (token, expert) pairs, streams each
active expert's blocked int4 weights once for all of its rows, and adds the weighted outputs,
with the same kernels and activation quantization as the per-expert path.
"""
from __future__ import annotations

import torch

from .int4_linear import Int4Linear

FIELDS = ("codes", "scale", "zero")


class FusedExperts:
    """The experts' tensor addresses as one table (rebuilt if the tensors move, as
    huge_pages.py moves them once after the load), and the call."""

    def __init__(self, experts: list, intermediate: int) -> None:
        self.experts, self.intermediate = experts, intermediate
        self.hidden = experts[0].gate_up.linear.in_features
        self.ops = experts[0].down_proj.kernels.ops
        self._table, self._key = None, None

    @classmethod
    def for_experts(cls, experts: list, intermediate: int) -> "FusedExperts | None":
        """None unless every expert is bias-free int4 in the blocked layout of a VNNI CPU, all
        of one shape (the kernel reads them through bare addresses)."""
        linears = [linear for expert in experts for linear in expert.linears()]
        if not all(isinstance(linear, Int4Linear) and linear.blocked and linear.bias is None and linear.kernels.vnni
                   for linear in linears):
            return None
        hidden = experts[0].gate_up.linear.in_features
        shapes = {((e.gate_up.linear.out_features, e.gate_up.linear.in_features), (e.down_proj.out_features,
                   e.down_proj.in_features)) for e in experts}
        if shapes != {((2 * intermediate, hidden), (hidden, intermediate))}:
            raise ValueError(f"experts of shapes {sorted(shapes)} for intermediate width {intermediate}")
        return cls(experts, intermediate)

    def takes(self, chosen: torch.Tensor) -> bool:
        """Whether every active expert's rows would take the small-batch kernel on their own
        (larger groups multiply faster as dequantized tiles: the per-expert path)."""
        rows = chosen.shape[0]
        expert = self.experts[0]
        if self._kernel_takes(expert, rows):
            return True  # no expert gets more rows than there are tokens
        return self._kernel_takes(expert, int(torch.bincount(chosen.view(-1)).max()))

    @staticmethod
    def _kernel_takes(expert, rows: int) -> bool:
        return all(linear.plan.path(rows) == "kernel" for linear in expert.linears())

    def __call__(self, x: torch.Tensor, route: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"x has {x.shape[-1]} columns, the experts {self.hidden}")
        return self.ops.q4b_moe_vnni8(x.float().contiguous(), chosen.contiguous(), route.float().contiguous(),
                                      self.table(), self.intermediate)

    def table(self) -> torch.Tensor:
        first, last = self.experts[0].gate_up.linear, self.experts[-1].down_proj
        key = (first.codes.data_ptr(), last.codes.data_ptr())
        if key != self._key:
            self._table = torch.tensor([[getattr(linear, field).data_ptr() for linear in
                                         (expert.gate_up.linear, expert.down_proj) for field in FIELDS]
                                        for expert in self.experts], dtype=torch.int64)
            self._key = key
        return self._table
