"""The weights a decode step streams, moved into one mapping backed by 2 MiB pages (and the
mapping the KV cache's pools are carved from, kv_storage.py).

A decode step reads every weight once, 385 MiB for int4 Qwen3-0.6B, and with 4 KiB pages that is
~100,000 TLB misses a step. Linux gives transparent huge pages only where asked
(``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` on most distributions), so the
weights are copied into one anonymous mapping advised ``MADV_HUGEPAGE``, 2 MiB-aligned. On a Zen 4
(2 cores), the same engine alternating between this copy of its weights and one in 4 KiB pages
took 11% less per int4 single-stream step (median of 40 turns; 13% by the best turn), 6% in
bfloat16 and 3% for int4 at 8 streams (``python benchmarks/bench_huge_pages.py``,
``benchmarks/results/2026-12-02-huge-pages/``).
Where the madvise is unknown (not Linux) or refused, the weights stay where they are.

What torch's allocator hands out is not reliably in 4 KiB pages either: numpy advises
MADV_HUGEPAGE over its large arrays, which come from the same malloc heap, and the advice stays on
those addresses after the array is freed. Whatever must be in small pages (the comparisons'
baselines) is mapped here too, advised MADV_NOHUGEPAGE.
"""
from __future__ import annotations

import logging
import mmap
from typing import Iterable

import torch

from qwen_serve.heap import return_free_heap

log = logging.getLogger("qwen_serve.torch")
HUGE_PAGE = 2 << 20
ALIGN = 64  # every tensor starts on a cache line, as torch's allocator places them
# Freed old copies go back to the OS every this many bytes: a 12-layer Qwen3-30B-A3B-geometry int4
# model (4.9 GiB) peaked at 12.8 GiB resident while moving without it.
TRIM_EVERY = 256 << 20


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def move_to_huge_pages(layers: Iterable) -> int:
    """Copy each layer's ``streamed_tensors()`` attributes into one huge-page mapping (one tensor
    at a time, so the old copy is freed as the new one takes its place) -> bytes moved."""
    unique = list({id(layer): layer for layer in layers}.values())
    fields = [(layer, name) for layer in unique for name in layer.streamed_tensors()
              if getattr(layer, name) is not None]
    sizes = [_nbytes(getattr(layer, name)) for layer, name in fields]
    pieces = advised_pieces(sizes, ALIGN, "the weights", huge=True)
    if pieces is None:
        return 0
    freed = 0
    for (layer, name), piece in zip(fields, pieces):
        old = getattr(layer, name)
        new = piece.view(old.dtype).view(old.shape)
        new.copy_(old)
        setattr(layer, name, new)
        del old
        freed += piece.numel()
        if freed >= TRIM_EVERY:  # else the old copies stay in the heap until the end: twice the weights
            return_free_heap()
            freed = 0
    return sum(round_up(n, ALIGN) for n in sizes)


def advised_pieces(sizes: list[int], align: int, what: str, huge: bool) -> list[torch.Tensor] | None:
    """Pieces of `sizes` bytes (uint8), each from a multiple of `align` past a 2 MiB boundary, of
    one anonymous mapping advised MADV_HUGEPAGE (`huge`) or MADV_NOHUGEPAGE, untouched: its pages
    become resident (2 MiB or 4 KiB at a time) where first written. None where the advice is
    unknown or refused, or the address space is; `what` names the contents in the log."""
    total = sum(round_up(n, align) for n in sizes)
    advice_name = "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE"
    advice = getattr(mmap, advice_name, None)
    if total == 0 or advice is None:
        return None
    try:
        mapping = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError) as error:
        log.info("%s stay in torch's memory: no mapping of %d bytes: %s", what, total, error)
        return None
    try:
        mapping.madvise(advice)
    except OSError as error:  # a kernel without transparent huge pages
        log.info("%s stay in torch's memory: madvise(%s) failed: %s", what, advice_name, error)
        mapping.close()
        return None
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # its views keep the mapping alive
    offset = -raw.data_ptr() % HUGE_PAGE
    pieces = []
    for n in sizes:
        pieces.append(raw[offset:offset + n])
        offset += round_up(n, align)
    return pieces


def _nbytes(t: torch.Tensor) -> int:
    if t.layout != torch.strided or not t.is_contiguous():  # oneDNN's opaque tensors are not strided
        raise ValueError("only contiguous strided tensors can move to huge pages")
    return t.numel() * t.element_size()
