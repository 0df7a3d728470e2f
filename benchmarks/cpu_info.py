"""The CPU a benchmark ran on, for the header of every result (model name and the vector flags)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_description() -> str:
    """e.g. 'AMD EPYC, 2 CPUs, flags avx2 fma avx512f ...' (Linux /proc/cpuinfo; else platform)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
            if model and flags:
                break
    except OSError:
        pass
    present = " ".join(f for f in VECTOR_FLAGS if f in flags) or "unknown"
    return f"{model}, {os.cpu_count()} CPUs, flags {present}"
