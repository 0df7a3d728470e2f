"""A step's tokens grouped by the experts their router chose, so each backend runs every active
expert once on all of its rows (its weights stream from memory once per step) and adds the
weighted outputs back in expert order: the same order for a row alone or in any batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ExpertGroup:
    expert: int
    rows: np.ndarray  # int64: the rows routed to this expert, ascending
    slots: np.ndarray  # int64: their flat indices (row * top_k + j) into the routing weights


def group_by_expert(chosen: np.ndarray) -> list[ExpertGroup]:
    """chosen [rows, top_k] expert ids -> one group per expert some row chose, by expert id."""
    flat = chosen.reshape(-1)
    slots = np.argsort(flat, kind="stable")
    experts, starts = np.unique(flat[slots], return_index=True)
    ends = np.append(starts[1:], flat.size)
    return [ExpertGroup(int(e), slots[a:b] // chosen.shape[1], slots[a:b]) for e, a, b in zip(experts, starts, ends)]
