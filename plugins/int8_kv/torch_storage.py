"""int8 keys and values on torch: each row (token, layer, kv head) as int8 codes with one float32
absmax scale, x ~= code * scale with code in -127..127. Reads return float32, so the executor's
attention is unchanged; memory per token is kv_bytes_per_token(..., 1, scale_bytes=4)."""
from __future__ import annotations

import torch

from qwen_serve.kv.memory import kv_bytes_per_token
from qwen_serve.kv.slabs import SlabGrownStorage

LEVELS = 127  # symmetric: -127..127, so a row's largest magnitude is stored exactly


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, heads, head_dim] float -> (int8 codes of that shape, float32 scales [n, heads])."""
    x = x.float()
    scale = x.abs().amax(dim=-1) / LEVELS
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    codes = torch.round(x / divisor[..., None]).clamp_(-LEVELS, LEVELS).to(torch.int8)
    return codes, scale


class TorchInt8KVStorage(SlabGrownStorage):
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 block_size: int, slab_blocks: int, max_blocks: int) -> None:
        super().__init__(block_size, slab_blocks, max_blocks)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        # per layer: [key codes, key scales, value codes, value scales]
        self.arrays = [[torch.empty((0, num_kv_heads, head_dim), dtype=torch.int8),
                        torch.empty((0, num_kv_heads), dtype=torch.float32),
                        torch.empty((0, num_kv_heads, head_dim), dtype=torch.int8),
                        torch.empty((0, num_kv_heads), dtype=torch.float32)] for _ in range(num_layers)]

    def _grow(self, new_blocks: int) -> None:
        old_slots = self.capacity_blocks * self.block_size
        for layer in self.arrays:
            for i, old in enumerate(layer):
                grown = torch.empty((new_blocks * self.block_size, *old.shape[1:]), dtype=old.dtype)
                grown[:old_slots] = old
                layer[i] = grown

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        k_codes, k_scales, v_codes, v_scales = self.arrays[layer]
        for codes, scales, x in ((k_codes, k_scales, keys), (v_codes, v_scales, values)):
            q, s = quantize_rows(x)
            codes.index_copy_(0, slots, q)
            scales.index_copy_(0, slots, s)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gather per array, whatever the shape of slots; returns float32."""
        flat = slots.reshape(-1)
        k_codes, k_scales, v_codes, v_scales = self.arrays[layer]
        k = k_codes.index_select(0, flat).float() * k_scales.index_select(0, flat)[..., None]
        v = v_codes.index_select(0, flat).float() * v_scales.index_select(0, flat)[..., None]
        shape = (*slots.shape, self.num_kv_heads, self.head_dim)
        return k.view(shape), v.view(shape)

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for layer in self.arrays:
            for t in layer:
                t[dst * bs:(dst + 1) * bs] = t[src * bs:(src + 1) * bs]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.arrays for t in layer)

    def bytes_per_token(self) -> int:
        codes, scales = self.arrays[0][:2]
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim,
                                  codes.element_size(), scales.element_size())
