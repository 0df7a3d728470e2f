"""Per-step tensors shared by every layer: positions, write slots, and how each sequence's
history is read. Built once per step from block tables, so a layer does one gather for all
decoding sequences and one per prefill chunk, never a per-token loop.

A decode row's position and write slot are two integers, so a decode-only step builds each of
its tensors once from Python lists (a tensor per chunk took ~0.35 ms of a 17 ms single-stream
step); the gathered histories of the generic decode path are built only when a layer asks.

A chunk that ends in speculative drafts is laid out as decodes, one per row (each attends to the
positions up to its own), so a verified token's logits come from the same arithmetic as decoding
it would have used: greedy output then equals decoding without speculation token for token.

A SlidingWindow cache holds only each sequence's last ``window`` positions: histories then start
at the window (``cache.window_start``) and prefill masks exclude keys that left it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import torch

from qwen_serve.kv.window import visible_keys
from qwen_serve.protocols import KVCache, SlidingWindow, StepBatch


@dataclass
class PrefillSpan:
    rows: slice  # this chunk's rows in the flattened step
    key_slots: torch.Tensor  # [L] slots of positions first .. start + n - 1 (first = 0 without a window)
    mask: torch.Tensor | None  # [n, L] True = may attend; None = plain causal from position 0


@dataclass
class DecodeHistory:
    """One single-token chunk: what its query attends to."""

    block_table: Sequence[int]
    first: int  # the oldest visible position (0 without a window)
    length: int  # positions 0 .. length - 1 exist, the new one included


@dataclass
class StepLayout:
    positions: torch.Tensor  # [T]
    write_slots: torch.Tensor  # [T]
    decode_rows: torch.Tensor  # [B] rows of single-token chunks
    decodes: list[DecodeHistory]  # [B], in decode_rows' order
    block_size: int
    prefills: list[PrefillSpan]
    sample_rows: torch.Tensor  # rows whose logits are wanted, in chunk order (increasing)
    paged: Any = None  # a paged_decode.PagedDecode when decode attention reads the cache in place
    states: Any = None  # a gated_deltanet.StateLayout when the model has linear-attention layers

    @property
    def all_rows_sampled(self) -> bool:
        """sample_rows is every row in order (it increases, so its length tells): no index_select needed."""
        return len(self.sample_rows) == len(self.positions)

    @cached_property
    def decode_slots(self) -> torch.Tensor:
        """[B, Lmax] slots of each decoding sequence's visible history, zero-padded (the gather path)."""
        slots = [slots_for(d.block_table, self.block_size, d.length, d.first) for d in self.decodes]
        padded = torch.zeros((len(slots), max((len(s) for s in slots), default=0)), dtype=torch.long)
        for row, s in zip(padded, slots):
            row[: len(s)] = s
        return padded

    @cached_property
    def decode_lengths(self) -> list[int]:
        """How many of each row of decode_slots are real keys (the rest is padding)."""
        return [d.length - d.first for d in self.decodes]


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
    positions: list[int] = []
    write_slots: list[int] = []
    decode_rows, decodes, prefills, sample_rows = [], [], [], []
    row = 0
    for chunk in batch.chunks:
        n = len(chunk.token_ids)
        stop = chunk.start + n
        first = cache.window_start(chunk.start) if window is not None else 0
        table = cache.block_table(chunk.seq_id)
        if n == 1 or chunk.num_draft:  # a drafted chunk's rows attend as decodes: verifying keeps decoding's numerics
            for i, position in enumerate(range(chunk.start, stop)):
                positions.append(position)
                write_slots.append(table[position // bs] * bs + position % bs)
                decode_rows.append(row + i)
                # a window's history is all visible to its one query
                visible = cache.window_start(position) if window is not None else 0
                decodes.append(DecodeHistory(table, visible, position + 1))
        else:
            slots = slots_for(table, bs, stop, first)
            positions.extend(range(chunk.start, stop))
            write_slots.extend(slots[chunk.start - first:].tolist())
            plain_causal = chunk.start == 0 and (window is None or stop <= window)
            mask = None if plain_causal else torch.from_numpy(visible_keys(chunk.start, stop, first, window))
            prefills.append(PrefillSpan(slice(row, row + n), slots, mask))
        row += n
        if chunk.sample:  # a chunk with drafts wants every draft position's logits too
            sample_rows.extend(range(row - 1 - chunk.num_draft, row))
    return StepLayout(
        positions=torch.tensor(positions, dtype=torch.long),
        write_slots=torch.tensor(write_slots, dtype=torch.long),
        decode_rows=torch.tensor(decode_rows, dtype=torch.long),
        decodes=decodes,
        block_size=bs,
        prefills=prefills,
        sample_rows=torch.tensor(sample_rows, dtype=torch.long),
    )
