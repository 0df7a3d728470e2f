"""Per-step tensors shared by every layer: positions, write slots, and how each sequence's
history is gathered. Built once per step from block tables, so a layer does one gather for all
decoding sequences and one per prefill chunk, never a per-token loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from qwen_serve.protocols import KVCache, StepBatch


@dataclass
class PrefillSpan:
    rows: slice  # this chunk's rows in the flattened step
    key_slots: torch.Tensor  # [L] slots of positions 0 .. start + n - 1
    mask: torch.Tensor | None  # [n, L] True = may attend; None = plain causal (start == 0)


@dataclass
class StepLayout:
    positions: torch.Tensor  # [T]
    write_slots: torch.Tensor  # [T]
    decode_rows: torch.Tensor  # [B] rows of single-token chunks
    decode_slots: torch.Tensor  # [B, Lmax]
    decode_mask: torch.Tensor  # [B, 1, 1, Lmax]
    prefills: list[PrefillSpan]
    sample_rows: torch.Tensor  # rows whose logits are wanted, in chunk order
    paged: Any = None  # a paged_decode.PagedDecode when decode attention reads the cache in place


def slots_for(block_table, block_size: int, stop: int) -> torch.Tensor:
    """Slots of positions 0 .. stop - 1 through a block table, vectorized."""
    n_blocks = -(-stop // block_size)
    blocks = torch.as_tensor(list(block_table[:n_blocks]), dtype=torch.long)
    return (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:stop]


def build_layout(batch: StepBatch, cache: KVCache) -> StepLayout:
    bs = cache.block_size
    positions, write_slots, decode_rows, decode_slots, prefills, sample_rows = [], [], [], [], [], []
    row = 0
    for chunk in batch.chunks:
        n = len(chunk.token_ids)
        stop = chunk.start + n
        slots = slots_for(cache.block_table(chunk.seq_id), bs, stop)
        positions.append(torch.arange(chunk.start, stop))
        write_slots.append(slots[chunk.start:])
        if n == 1:
            decode_rows.append(row)
            decode_slots.append(slots)
        else:
            mask = None
            if chunk.start > 0:
                mask = torch.arange(stop)[None, :] <= torch.arange(chunk.start, stop)[:, None]
            prefills.append(PrefillSpan(slice(row, row + n), slots, mask))
        row += n
        if chunk.sample:
            sample_rows.append(row - 1)
    lengths = [len(s) for s in decode_slots]
    longest = max(lengths, default=0)
    padded = torch.zeros((len(decode_slots), longest), dtype=torch.long)
    for i, s in enumerate(decode_slots):
        padded[i, : len(s)] = s
    key_mask = torch.arange(longest)[None, :] < torch.as_tensor(lengths, dtype=torch.long)[:, None]
    return StepLayout(
        positions=torch.cat(positions),
        write_slots=torch.cat(write_slots),
        decode_rows=torch.as_tensor(decode_rows, dtype=torch.long),
        decode_slots=padded,
        decode_mask=key_mask[:, None, None, :],
        prefills=prefills,
        sample_rows=torch.as_tensor(sample_rows, dtype=torch.long),
    )
