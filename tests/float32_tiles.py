"""Tests against a float reference take the prefill tiles in float32, as on CPUs without native
bf16: bf16 tiles round products to 8 bits (~0.04 on a tiny random model's log-probabilities), and
their effect on quality is check 6's to judge, not these tests'."""
from __future__ import annotations

from qwen_serve.backends.torch_cpu.path_plan import PathPlan


def use_float32_tiles(llm) -> None:
    """Every planned projection of llm's torch executor: its bf16 tile classes become float32 tiles."""
    for linear in llm.parts.executor.linears():
        if getattr(linear, "plan", None) is not None:
            linear.plan = PathPlan(tuple(p.replace("tiles_bf16", "tiles_f32") for p in linear.plan.paths))
