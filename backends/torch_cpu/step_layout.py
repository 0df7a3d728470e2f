"""Per-step tensors shared by every layer: positions, write slots, and how each sequence's
history is gathered. Built once per step from block tables, so a layer does one gather for all
decoding sequences and one per prefill chunk, never a per-token loop.

A SlidingWindow cache holds only each sequence's last ``window`` positions: histories then start
at the window (``cache.window_start``) and prefill masks exclude keys that left it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from qwen_serve.kv.window import visible_keys
from qwen_serve.protocols import KVCache, SlidingWindow, StepBatch


@dataclass
class PrefillSpan:
    rows: slice  # this chunk's rows in the flattened step
    key_slots: torch.Tensor  # [L] slots of positions first .. start + n - 1 (first = 0 without a window)
    mask: torch.Tensor | None  # [n, L] True = may attend; None = plain causal from position 0


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


def slots_for(block_table, block_size: int, stop: int, first: int = 0) -> torch.Tensor:
    """Slots of positions first .. stop - 1 through a block table, vectorized."""
    first_block = first // block_size
    n_blocks = -(-stop // block_size)
    blocks = torch.as_tensor(list(block_table[first_block:n_blocks]), dtype=torch.long)
    offset = first_block * block_size
    return (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[first - offset:stop - offset]


def build_layout(batch: StepBatch, cache: KVCache) -> StepLayout:
    bs = cache.block_size
    window = cache.window if isinstance(cache, SlidingWindow) else None
    positions, write_slots, decode_rows, decode_slots, prefills, sample_rows = [], [], [], [], [], []
    row = 0
    for chunk in batch.chunks:
        n = len(chunk.token_ids)
        stop = chunk.start + n
        first = cache.window_start(chunk.start) if window is not None else 0
        slots = slots_for(cache.block_table(chunk.seq_id), bs, stop, first)
        positions.append(torch.arange(chunk.start, stop))
        write_slots.append(slots[chunk.start - first:])
        if n == 1:
            decode_rows.append(row)
            decode_slots.append(slots)  # a window's history is all visible to its one query
        else:
            plain_causal = chunk.start == 0 and (window is None or stop <= window)
            mask = None if plain_causal else torch.from_numpy(visible_keys(chunk.start, stop, first, window))
            prefills.append(PrefillSpan(slice(row, row + n), slots, mask))
        row += n
        if chunk.sample:  # a chunk with drafts wants every draft position's logits too
            sample_rows.extend(range(row - 1 - chunk.num_draft, row))
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
