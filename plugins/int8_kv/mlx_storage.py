"""int8 keys and values on MLX, the same format as torch_storage: int8 codes with one float32
absmax scale per row (token, layer, kv head). As in the backend's own storage, every mutation is
evaluated at once, so no graph is carried from one step into the next."""
from __future__ import annotations

from typing import Any

from qwen_serve.backends.mlx.mx import mx
from qwen_serve.kv.memory import kv_bytes_per_token
from qwen_serve.kv.slabs import SlabGrownStorage

LEVELS = 127


def quantize_rows(x: mx.array) -> tuple[mx.array, mx.array]:
    """[n, heads, head_dim] float -> (int8 codes of that shape, float32 scales [n, heads])."""
    x = x.astype(mx.float32)
    scale = mx.max(mx.abs(x), axis=-1) / LEVELS
    divisor = mx.where(scale > 0, scale, mx.ones_like(scale))
    codes = mx.clip(mx.round(x / divisor[..., None]), -LEVELS, LEVELS).astype(mx.int8)
    return codes, scale


class MLXInt8KVStorage(SlabGrownStorage):
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 block_size: int, slab_blocks: int, max_blocks: int) -> None:
        super().__init__(block_size, slab_blocks, max_blocks)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        # per layer: [key codes, key scales, value codes, value scales]
        self.arrays = [[mx.zeros((0, num_kv_heads, head_dim), dtype=mx.int8),
                        mx.zeros((0, num_kv_heads), dtype=mx.float32),
                        mx.zeros((0, num_kv_heads, head_dim), dtype=mx.int8),
                        mx.zeros((0, num_kv_heads), dtype=mx.float32)] for _ in range(num_layers)]
        mx.eval(self.arrays)

    def _grow(self, new_blocks: int) -> None:
        extra = (new_blocks - self.capacity_blocks) * self.block_size
        for layer in self.arrays:
            for i, old in enumerate(layer):
                layer[i] = mx.concatenate([old, mx.zeros((extra, *old.shape[1:]), dtype=old.dtype)])
        mx.eval(self.arrays)

    def write(self, layer: int, slots: Any, keys: mx.array, values: mx.array) -> None:
        slots = _as_index(slots)
        arrays = self.arrays[layer]
        arrays[0][slots], arrays[1][slots] = quantize_rows(keys)
        arrays[2][slots], arrays[3][slots] = quantize_rows(values)
        mx.eval(arrays)

    def read(self, layer: int, slots: Any) -> tuple[mx.array, mx.array]:
        """One gather per array, whatever the shape of slots; returns float32."""
        slots = _as_index(slots)
        flat = slots.reshape(-1)
        k_codes, k_scales, v_codes, v_scales = self.arrays[layer]
        k = k_codes[flat].astype(mx.float32) * k_scales[flat][..., None]
        v = v_codes[flat].astype(mx.float32) * v_scales[flat][..., None]
        shape = (*slots.shape, self.num_kv_heads, self.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for layer in self.arrays:
            for a in layer:
                a[dst * bs:(dst + 1) * bs] = a[src * bs:(src + 1) * bs]
        mx.eval(self.arrays)

    def nbytes(self) -> int:
        return sum(a.nbytes for layer in self.arrays for a in layer)

    def bytes_per_token(self) -> int:
        codes, scales = self.arrays[0][:2]
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim,
                                  codes.dtype.size, scales.dtype.size)


def _as_index(slots: Any) -> mx.array:
    return slots if isinstance(slots, mx.array) else mx.array(slots, dtype=mx.int32)
