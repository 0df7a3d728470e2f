"""KV-cache memory arithmetic, the one copy of it: the start-up memory plan, every
backend's KV storage, the int8 cache and `qwen-serve kv-table` all count bytes here.

    KV bytes per token = 2 (K and V) x layers x kv heads x (head_dim x element bytes + scale bytes)

No d_model and no number of query heads: grouped-query attention stores only the kv heads.
A quantized format adds its per-row scale, one per (token, layer, kv head) for K and for V,
which is why int8 with a float32 scale is 1.94x smaller than bf16 at head_dim 128, not 2x.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVFormat:
    """How one row (one token, one layer, one kv head) of keys or values is stored."""

    name: str
    element_bytes: int
    scale_bytes: int = 0  # per row, e.g. a float32 absmax scale for int8

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, self.element_bytes, self.scale_bytes)


FLOAT32 = KVFormat("float32", 4)
BFLOAT16 = KVFormat("bfloat16", 2)
FLOAT16 = KVFormat("float16", 2)
INT8 = KVFormat("int8", 1, scale_bytes=4)
INT8_WITHOUT_SCALES = KVFormat("int8 without scales", 1)
FLOAT_FORMATS = {f.name: f for f in (FLOAT32, BFLOAT16, FLOAT16)}


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, element_bytes: int,
                       scale_bytes: int = 0) -> int:
    """Bytes one token's keys and values take in every layer (the formula above)."""
    return 2 * num_layers * num_kv_heads * (head_dim * element_bytes + scale_bytes)


def kv_bytes_at(context: int, bytes_per_token_per_layer: int, full_layers: int, windowed_layers: int = 0,
                window: int | None = None) -> int:
    """One sequence's KV bytes at `context` tokens when `full_layers` keep every token and
    `windowed_layers` keep only the last `window` (hybrid and sliding-window layouts)."""
    kept = min(context, window) if window is not None else context
    return bytes_per_token_per_layer * (full_layers * context + windowed_layers * kept)


def blocks_spanned(positions: int, block_size: int) -> int:
    """The most blocks a run of `positions` consecutive positions can touch, wherever it starts:
    a window of W positions needs this many blocks, not W / block_size."""
    if positions <= 0:
        return 0
    return -(-(positions - 1) // block_size) + 1


def sequences_that_fit(budget_bytes: int, weight_bytes: int, bytes_per_sequence: int) -> int:
    """How many sequences' KV fit in what the weights leave of the budget (0 if nothing is left)."""
    if bytes_per_sequence <= 0:
        raise ValueError("bytes_per_sequence must be positive")
    return max(0, budget_bytes - weight_bytes) // bytes_per_sequence


def format_bytes(n: float) -> str:
    """Binary units, at most two decimals, trailing zeros dropped: 144 KiB, 4.5 GiB, 1.75 MiB."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {unit}"
