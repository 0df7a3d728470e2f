"""Key/value tensors for every layer, addressed by slot, grown a slab of blocks at a time so
resident memory follows the blocks actually handed out, not the configured pool size.

Each layer's keys and values are views of one buffer of the whole pool, allocated on the first
growth: its pages become resident only when first written, so a growth is a longer view, not a
copy. (Copying the pool on every slab cost a server's early prefills O(pool) each: a 512-token
prompt took 2.7 s instead of 2.1, 1.8 s of CPU in copies, once the cache held a few thousand
tokens; Ice Lake, Qwen3-0.6B geometry, benchmarks/prefill.py.)

The buffers lie in one mapping advised to use 2 MiB pages (huge_pages.py), each from a page
boundary, so resident memory runs at most 2 MiB a buffer ahead of the blocks written. Decode
attention reads each sequence's blocks scattered over the pool (16-32 KiB of keys a block of 16
tokens at Qwen3.5's and Qwen3-0.6B's geometries, bfloat16): in 4 KiB pages every block is pages
to translate anew, and the hardware prefetcher stops at each page's end. Against the same pools in
4 KiB pages, in turns, the paged decode kernel took 6% less by the median of 16 cases: 9-23% less
over float32 caches at Qwen3-0.6B's geometry, from 7% less to 3% more over Qwen3.5's bfloat16
cache (Zen 4, 2 threads; `bench_attention.py --decode --compare-pages`,
benchmarks/results/2026-12-06-kv-huge-pages)."""
from __future__ import annotations

import torch

from qwen_serve.kv.memory import kv_bytes_per_token
from qwen_serve.kv.slabs import SlabGrownStorage

from .huge_pages import HUGE_PAGE, advised_pieces
from .layer_ops import float_rows
from .native import Kernels, load_kernels

KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # what kv_write.cpp stores


class TorchKVStorage(SlabGrownStorage):
    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
        block_size: int, slab_blocks: int, max_blocks: int, kernels: Kernels | None | str = "auto",
        huge_pages: bool = True,
    ) -> None:
        super().__init__(block_size, slab_blocks, max_blocks)
        self.dtype = dtype
        self.huge_pages = huge_pages  # False: the pools advised to stay in 4 KiB pages (benchmarks compare)
        self.kernels = load_kernels() if kernels == "auto" else kernels
        shape = (0, num_kv_heads, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype) for _ in range(num_layers)]
        # per layer, the whole pool's key and value slots (untouched until written); None: not yet
        # allocated; empty: the address space was refused, so every growth copies
        self._pools: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def _grow(self, new_blocks: int) -> None:
        new_slots = new_blocks * self.block_size
        if self._pools is None:
            self._pools = self._whole_pools()
        for tensors, pools in zip((self.keys, self.values), self._pools):
            for i, old in enumerate(tensors):
                if pools:
                    tensors[i] = pools[i][:new_slots]
                else:
                    grown = torch.empty((new_slots, *old.shape[1:]), dtype=self.dtype)
                    grown[: old.shape[0]] = old
                    tensors[i] = grown

    def _whole_pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        slots = self.max_blocks * self.block_size
        shape = (slots, *self.keys[0].shape[1:])
        count = len(self.keys)
        nbytes = slots * shape[1] * shape[2] * self.dtype.itemsize
        # each pool from a page boundary
        pieces = advised_pieces([nbytes] * 2 * count, HUGE_PAGE, "the KV cache's pools", huge=self.huge_pages)
        if pieces is not None:
            pools = [piece.view(self.dtype).view(shape) for piece in pieces]
            return pools[:count], pools[count:]
        try:
            return tuple([torch.empty(shape, dtype=self.dtype) for _ in range(count)] for _ in range(2))
        except RuntimeError:  # more address space than the system grants
            return [], []

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """keys, values [T, kv heads, D]; float32 rows at a stride (column slices) go through one
        kernel call, which rounds them to the storage's dtype as torch would."""
        if self.kernels is not None and self.dtype in KERNEL_DTYPES and slots.dtype == torch.long \
                and slots.dim() == 1 and slots.is_contiguous() and float_rows(keys, values):
            self.kernels.ops.kv_write_(self.keys[layer], self.values[layer], slots, keys, values)
            return
        self.keys[layer].index_copy_(0, slots, keys.to(self.dtype))
        self.values[layer].index_copy_(0, slots, values.to(self.dtype))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gather per call, whatever the shape of slots; returns float32."""
        flat = slots.reshape(-1)
        k = self.keys[layer].index_select(0, flat).float()
        v = self.values[layer].index_select(0, flat).float()
        shape = (*slots.shape, *k.shape[1:])
        return k.view(shape), v.view(shape)

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[dst * bs:(dst + 1) * bs] = t[src * bs:(src + 1) * bs]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def bytes_per_token(self) -> int:
        _, heads, head_dim = self.keys[0].shape
        return kv_bytes_per_token(len(self.keys), heads, head_dim, self.keys[0].element_size())
