"""The machine a result was measured on: CPU model and flags, memory bandwidth measured on the
spot, software versions. Every benchmark result carries this."""
from __future__ import annotations

import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

# The flags that decide which kernels a CPU can run (the rest are kept in "flags" too).
KEY_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
             "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """Model name, vendor/family/model/stepping and flags of the first processor in /proc/cpuinfo."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = fields.get("flags", "").split()
    return {
        "model_name": fields.get("model name") or platform.processor() or platform.machine(),
        "vendor": fields.get("vendor_id"),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "stepping": fields.get("stepping"),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "key_flags": [f for f in KEY_FLAGS if f in flags],
        "flags": flags,
    }


def memory_bandwidth(mib: int = 512, repeats: int = 7, threads: int | None = None) -> dict[str, Any]:
    """Read bandwidth: each thread streams its share of a `mib` MiB float32 array (far past the
    caches) through np.add.reduce into a 16 KiB accumulator; the best of `repeats` passes."""
    threads = threads or os.cpu_count() or 1
    data = np.ones((mib * 2**20 // 4 // 4096, 4096), dtype=np.float32)
    shares = np.array_split(data, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(lambda share: np.add.reduce(share, axis=0), shares))
            best = max(best, data.nbytes / (time.perf_counter() - start))
    return {"read_gb_s": round(best / 1e9, 2), "method": f"numpy add.reduce over {mib} MiB float32, {threads} threads, "
                                                         f"best of {repeats}"}


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("qwen-serve", "aiohttp", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def describe_machine(measure_bandwidth: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {"cpu": cpu_info(), "versions": versions(), "load_average": os.getloadavg()}
    if measure_bandwidth:
        info["memory_bandwidth"] = memory_bandwidth()
    return info
