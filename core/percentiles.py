"""The one percentile rule of every figure qwen-serve prints: linear interpolation between order
statistics (numpy's default, the convention of vLLM's and SGLang's serving benchmarks), so the
server's /metrics, `qwen-serve bench` and the benchmark scripts compare."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def percentiles(samples: Iterable[float], quantiles: Sequence[float]) -> dict[str, float | None]:
    """{"p50": ..., ...} for the `quantiles` asked (in percent); None each when there are no samples."""
    values = np.fromiter(samples, dtype=np.float64)
    if values.size == 0:
        return {f"p{q:g}": None for q in quantiles}
    return {f"p{q:g}": float(v) for q, v in zip(quantiles, np.percentile(values, quantiles))}
