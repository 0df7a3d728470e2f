"""Key/value arrays for every layer, addressed by slot, grown a slab of blocks at a time.

MLX is lazy: ``a[slots] = x`` only records a scatter. Each mutation is evaluated at once, so
the stored arrays never carry a graph from one step into the next (and MLX updates the buffer
in place, since nothing else holds the old version), and the engine may run on another thread
than the one that built the storage: MLX evaluates pending work only on the thread that
recorded it.
"""
from __future__ import annotations

from typing import Any

from qwen_serve.kv.memory import kv_bytes_per_token
from qwen_serve.kv.slabs import SlabGrownStorage

from .mx import mx


class MLXKVStorage(SlabGrownStorage):
    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: mx.Dtype,
        block_size: int, slab_blocks: int, max_blocks: int,
    ) -> None:
        super().__init__(block_size, slab_blocks, max_blocks)
        self.dtype = dtype
        shape = (0, num_kv_heads, head_dim)
        self.keys = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [mx.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        mx.eval(self.keys, self.values)

    def _grow(self, new_blocks: int) -> None:
        extra = (new_blocks - self.capacity_blocks) * self.block_size
        for arrays in (self.keys, self.values):
            for i, old in enumerate(arrays):
                arrays[i] = mx.concatenate([old, mx.zeros((extra, *old.shape[1:]), dtype=self.dtype)])
        mx.eval(self.keys, self.values)

    def write(self, layer: int, slots: Any, keys: mx.array, values: mx.array) -> None:
        slots = _as_index(slots)
        self.keys[layer][slots] = keys.astype(self.dtype)
        self.values[layer][slots] = values.astype(self.dtype)
        mx.eval(self.keys[layer], self.values[layer])

    def read(self, layer: int, slots: Any) -> tuple[mx.array, mx.array]:
        """One gather per call, whatever the shape of slots; returns float32."""
        slots = _as_index(slots)
        flat = slots.reshape(-1)
        k, v = self.keys[layer][flat], self.values[layer][flat]
        if self.dtype != mx.float32:
            k, v = k.astype(mx.float32), v.astype(mx.float32)
        shape = (*slots.shape, *k.shape[1:])
        return k.reshape(shape), v.reshape(shape)

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for arrays in (self.keys, self.values):
            for a in arrays:
                a[dst * bs:(dst + 1) * bs] = a[src * bs:(src + 1) * bs]
        mx.eval(self.keys, self.values)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.keys, *self.values))

    def bytes_per_token(self) -> int:
        _, heads, head_dim = self.keys[0].shape
        return kv_bytes_per_token(len(self.keys), heads, head_dim, self.dtype.size)


def _as_index(slots: Any) -> mx.array:
    return slots if isinstance(slots, mx.array) else mx.array(slots, dtype=mx.int32)
