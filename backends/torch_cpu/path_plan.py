"""Which way a packed projection multiplies, by how many rows x has.

A quantized (int4, int8) or blocked bf16 layer has up to three paths: its C++ kernel (reads the
packed weight once per call, made for a few rows), or a tile of the weight unpacked and handed to
torch's GEMM in float32 or bfloat16 (an unpack per call that many rows share). A bf16 layer may
instead keep oneDNN's own reordered weight ("onednn"), which then takes every row count: a layer
holds one layout. A PathPlan names one path per row class; kernel_choice.py fills it in by timing
the paths on the CPU at hand.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

# Row classes as (fewest, most) rows; a call with more rows than the last class takes its path.
# 65-512 is cut at 192: on a Zen 3 (AVX2) the int4 kernel led the tiles by 1.8x at 65 rows and
# lagged them 1.3x at 512, so one class over both took the kernel for whole prefill chunks.
ROW_CLASSES = ((1, 1), (2, 8), (9, 16), (17, 64), (65, 192), (193, 512))
CLASS_LABELS = tuple(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ROW_CLASSES)
_TOPS = [hi for _, hi in ROW_CLASSES]
PATHS = ("kernel", "tiles_f32", "tiles_bf16", "onednn")
ONEDNN = "onednn"  # a weight layout of its own: a plan takes it for every row class or for none
TILE_DTYPES = {"tiles_f32": torch.float32, "tiles_bf16": torch.bfloat16}


def row_class(rows: int) -> int:
    return min(bisect.bisect_left(_TOPS, rows), len(ROW_CLASSES) - 1)


@dataclass(frozen=True)
class PathPlan:
    paths: tuple[str, ...]  # one of PATHS per row class

    def path(self, rows: int) -> str:
        return self.paths[row_class(rows)]

    @classmethod
    def fixed(cls, path: str) -> "PathPlan":
        return cls((path,) * len(ROW_CLASSES))
