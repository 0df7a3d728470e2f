"""Per-step index arrays shared by every layer, built once per step from block tables.

The step's tokens are laid out decodes first, then each prefill chunk: every op but attention
works token by token, so the row order is ours to choose, and with this one the attention
outputs (one call for all single-token chunks, one per prefill chunk) simply concatenate.
``sample_rows`` puts the logits back in the engine's chunk order. Every history a layer needs
is gathered by one read of ``read_slots``: the padded decode histories, then each prefill's.
A SlidingWindow cache holds only each sequence's last ``window`` positions: histories then start
at the window (``cache.window_start``) and prefill masks exclude keys that left it. A cache that
holds recurrent states (a hybrid model's) gives each chunk its slot (``states``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from qwen_serve.kv.hybrid import chunk_snapshots
from qwen_serve.kv.window import visible_keys
from qwen_serve.protocols import RecurrentState, ScheduledChunk, SlidingWindow, StepBatch

from .mx import mx


@dataclass(frozen=True)
class PrefillSpan:
    rows: slice  # this chunk's queries among the step's rows
    keys: slice  # its history (positions first .. start + n - 1) within the step's one read
    mask: mx.array | None = None  # [n, len(history)] True = may attend; None = "causal"


@dataclass(frozen=True)
class ChunkState:
    """Where one chunk of the step keeps its linear-attention state."""

    rows: slice  # its rows in the layout's order
    slot: int
    fresh: bool  # it starts its sequence: the state starts at zeros, whatever the slot held
    snapshots: tuple[tuple[int, int], ...]  # (rows in, slot): also leave the state after that many rows there


@dataclass(frozen=True)
class StepLayout:
    token_ids: mx.array  # [T] in row order
    positions: mx.array  # [T]
    write_slots: mx.array  # [T]
    read_slots: mx.array  # [B * decode_len + sum of prefill history lengths]
    num_decodes: int  # B: rows 0 .. B - 1 are single-token chunks
    decode_len: int  # longest decode history; shorter ones are padded and masked
    decode_mask: mx.array | None  # [B, 1, 1, decode_len], True = may attend; None if unpadded
    prefills: list[PrefillSpan]
    sample_rows: mx.array  # rows whose logits are wanted, in chunk order
    in_chunk_order: mx.array  # [T] every row, in chunk order (the engine's): rows[in_chunk_order]
    states: list[ChunkState]  # every chunk's, in row order (empty unless the cache holds states)


def slots_for(block_table: Sequence[int], block_size: int, stop: int, first: int = 0) -> np.ndarray:
    """Slots of positions first .. stop - 1 through a block table, vectorized."""
    first_block = first // block_size
    n_blocks = -(-stop // block_size)
    blocks = np.asarray(block_table[first_block:n_blocks], dtype=np.int64)
    offset = first_block * block_size
    return (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)[first - offset:stop - offset]


def build_layout(batch: StepBatch, block_size: int, block_table: Callable[[int], Sequence[int]],
                 sliding: SlidingWindow | None = None, recurrent: RecurrentState | None = None) -> StepLayout:
    window = sliding.window if sliding is not None else None
    decodes = [c for c in batch.chunks if len(c.token_ids) == 1]
    prefills = [c for c in batch.chunks if len(c.token_ids) > 1]
    ordered: list[ScheduledChunk] = decodes + prefills
    firsts = [sliding.window_start(c.start) if sliding is not None else 0 for c in ordered]
    histories = [slots_for(block_table(c.seq_id), block_size, c.start + len(c.token_ids), first)
                 for c, first in zip(ordered, firsts)]

    end_row: dict[int, int] = {}
    row = 0
    states = []
    for chunk in ordered:
        n = len(chunk.token_ids)
        if recurrent is not None:
            states.append(ChunkState(slice(row, row + n), recurrent.state_slot(chunk.seq_id), chunk.start == 0,
                                     tuple(chunk_snapshots(recurrent, chunk))))
        row += n
        end_row[id(chunk)] = row
    # a chunk with drafts wants every draft position's logits too
    sample_rows = [r for c in batch.chunks if c.sample for r in range(end_row[id(c)] - 1 - c.num_draft, end_row[id(c)])]
    in_chunk_order = [r for c in batch.chunks for r in range(end_row[id(c)] - len(c.token_ids), end_row[id(c)])]

    decode_hist = histories[:len(decodes)]
    lengths = np.array([len(h) for h in decode_hist], dtype=np.int64)
    decode_len = int(lengths.max(initial=0))
    padded = np.zeros((len(decodes), decode_len), dtype=np.int64)  # slot 0 stands in for padding
    for i, h in enumerate(decode_hist):
        padded[i, :len(h)] = h
    mask = None
    if len(decodes) and (lengths < decode_len).any():
        mask = mx.array((np.arange(decode_len)[None, :] < lengths[:, None])[:, None, None, :])

    spans, reads = [], [padded.reshape(-1)]
    row, key = len(decodes), padded.size
    for chunk, history, first in zip(prefills, histories[len(decodes):], firsts[len(decodes):]):
        n = len(chunk.token_ids)
        stop = chunk.start + n
        # "causal" aligns the last query with the last key: exact unless the window cuts keys off
        windowed = window is not None and stop > window
        span_mask = mx.array(visible_keys(chunk.start, stop, first, window)) if windowed else None
        spans.append(PrefillSpan(slice(row, row + n), slice(key, key + len(history)), span_mask))
        reads.append(history)
        row += n
        key += len(history)

    return StepLayout(
        token_ids=_index([t for c in ordered for t in c.token_ids]),
        positions=_index(np.concatenate([np.arange(c.start, c.start + len(c.token_ids)) for c in ordered])),
        write_slots=_index(np.concatenate([h[c.start - f:] for c, h, f in zip(ordered, histories, firsts)])),
        read_slots=_index(np.concatenate(reads)),
        num_decodes=len(decodes),
        decode_len=decode_len,
        decode_mask=mask,
        prefills=spans,
        sample_rows=_index(sample_rows),
        in_chunk_order=_index(in_chunk_order),
        states=states,
    )


def _index(values) -> mx.array:
    return mx.array(np.asarray(values, dtype=np.int32))
