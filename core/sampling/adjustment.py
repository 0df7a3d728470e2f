"""What logits processors hand to a sampler: numpy arrays, never a backend's tensors.

A LogitsAdjustment is one row's change; the engine merges a batch's rows into one BatchAdjustment
of flat (row, token) arrays, so a backend applies the whole batch in three vector operations
(the sampling rule's first two stages), whatever mix of settings the rows have:

1. penalties: ``logits[row, id]`` divided by its factor where >= 0, multiplied where < 0
   (the CTRL / transformers repetition penalty, same arithmetic);
2. biases: ``logits[row, id] += value`` (logit_bias, presence / frequency penalties, -inf to
   suppress a token);
3. masks: tokens whose bit is 0 in the row's bitmask become -inf (bit ``t % 32`` of int32 word
   ``t // 32`` is token t, llguidance's and xgrammar's layout).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def _no_ids() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _no_values() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class LogitsAdjustment:
    """One row's change. Ids within one field are unique; arrays are int64 ids, float32 values."""

    penalty_ids: np.ndarray = field(default_factory=_no_ids)
    penalty_factors: np.ndarray = field(default_factory=_no_values)
    bias_ids: np.ndarray = field(default_factory=_no_ids)
    bias_values: np.ndarray = field(default_factory=_no_values)
    allowed: np.ndarray | None = None  # int32 bitmask [ceil(vocab / 32)]

    @staticmethod
    def merge(parts: Sequence["LogitsAdjustment"]) -> "LogitsAdjustment":
        """Several processors' changes to one row as one: factors of a shared id multiply (the
        same result as applying them one after the other), biases add, masks intersect."""
        if len(parts) == 1:
            return parts[0]
        penalty_ids, penalty_factors = _combine([p.penalty_ids for p in parts], [p.penalty_factors for p in parts],
                                                np.multiply)
        bias_ids, bias_values = _combine([p.bias_ids for p in parts], [p.bias_values for p in parts], np.add)
        masks = [p.allowed for p in parts if p.allowed is not None]
        allowed = np.bitwise_and.reduce(masks) if len(masks) > 1 else (masks[0] if masks else None)
        return LogitsAdjustment(penalty_ids, penalty_factors, bias_ids, bias_values, allowed)


def _combine(id_arrays: list[np.ndarray], value_arrays: list[np.ndarray], ufunc) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate(id_arrays)
    values = np.concatenate(value_arrays).astype(np.float32)
    unique, where = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        return ids, values
    out = np.full(len(unique), 1.0 if ufunc is np.multiply else 0.0, dtype=np.float32)
    ufunc.at(out, where, values)
    return unique, out


@dataclass(frozen=True, eq=False)
class BatchAdjustment:
    """Every adjusted row of a batch, flattened; row numbers index the logits given to the sampler."""

    penalty_rows: np.ndarray
    penalty_ids: np.ndarray
    penalty_factors: np.ndarray
    bias_rows: np.ndarray
    bias_ids: np.ndarray
    bias_values: np.ndarray
    mask_rows: np.ndarray  # int64 [R]
    masks: np.ndarray  # int32 [R, words]

    @classmethod
    def of_rows(cls, rows: Sequence[LogitsAdjustment | None]) -> "BatchAdjustment | None":
        """None when no row changes: the sampler then runs exactly as without processors."""
        present = [(i, a) for i, a in enumerate(rows) if a is not None]
        if not present:
            return None

        def flat(ids_of, values_of):
            row_ids = [np.full(len(ids_of(a)), i, dtype=np.int64) for i, a in present]
            return (np.concatenate(row_ids), np.concatenate([ids_of(a) for _, a in present]).astype(np.int64),
                    np.concatenate([values_of(a) for _, a in present]).astype(np.float32))

        penalty = flat(lambda a: a.penalty_ids, lambda a: a.penalty_factors)
        bias = flat(lambda a: a.bias_ids, lambda a: a.bias_values)
        masked = [(i, a.allowed) for i, a in present if a is not None and a.allowed is not None]
        mask_rows = np.array([i for i, _ in masked], dtype=np.int64)
        masks = np.stack([m for _, m in masked]).astype(np.int32, copy=False) if masked else np.zeros((0, 0), np.int32)
        return cls(*penalty, *bias, mask_rows, masks)

    def allowed_tokens(self, vocab_size: int) -> np.ndarray:
        """The masks as bool [len(mask_rows), vocab_size]; tokens past a mask's end are not allowed."""
        bits = np.unpackbits(np.ascontiguousarray(self.masks).view(np.uint8), axis=1, bitorder="little")
        if bits.shape[1] < vocab_size:
            bits = np.pad(bits, ((0, 0), (0, vocab_size - bits.shape[1])))
        return bits[:, :vocab_size].astype(bool)
