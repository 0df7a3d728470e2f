"""The machine a result was measured on: CPU model and flags, memory bandwidth measured on the
spot, software versions and the source's commit. Every benchmark result carries this, and every
benchmark script prints machine_header() above its figures."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..cpu import KEY_FLAGS, first_processor, flags_of, key_flags, model_name_of, this_processor

SOURCE = Path(__file__).resolve().parent  # resolved: a symlinked package still finds its checkout
VERSIONED = ("qwen-serve", "aiohttp", "numpy", "torch", "mlx")


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """Model name, vendor/family/model/stepping and flags of the first processor of /proc/cpuinfo
    (this machine's, or the `cpuinfo` text given)."""
    fields = this_processor() if cpuinfo is None else first_processor(cpuinfo)
    flags = sorted(flags_of(fields))
    return {
        "model_name": model_name_of(fields),
        "vendor": fields.get("vendor_id"),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "stepping": fields.get("stepping"),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "key_flags": key_flags(flags),
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
    """Python, the platform and the installed versions of what the figures depend on (read from
    the distributions' metadata, so torch is not imported for it)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def source_commit() -> str:
    """`git describe --always --dirty` of the checkout qwen_serve runs from ("unknown" outside one)."""
    try:
        return subprocess.run(["git", "-C", str(SOURCE), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe_machine(measure_bandwidth: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {"cpu": cpu_info(), "versions": versions(), "commit": source_commit(),
                            "load_average": os.getloadavg()}
    if measure_bandwidth:
        info["memory_bandwidth"] = memory_bandwidth()
    return info


def machine_header(machine: dict[str, Any] | None = None) -> str:
    """The lines that head a result: CPU and its key flags, bandwidth when measured, versions,
    commit (this machine's now when no recorded `machine` is given)."""
    machine = machine or describe_machine(measure_bandwidth=False)
    cpu, recorded = machine["cpu"], dict(machine.get("versions", {}))
    bandwidth = machine.get("memory_bandwidth", {}).get("read_gb_s")
    load = machine.get("load_average")
    return "\n".join([
        f"CPU: {cpu['model_name']} ({cpu.get('usable_cpus')} usable CPUs); "
        f"flags: {' '.join(cpu['key_flags']) or 'none of ' + ', '.join(KEY_FLAGS)}"
        + (f"; memory bandwidth {bandwidth} GB/s" if bandwidth is not None else ""),
        f"versions: {', '.join(f'{name} {v}' for name, v in recorded.items() if name != 'platform')}; "
        f"{recorded.get('platform', 'platform not recorded')}",
        f"commit: {machine.get('commit', 'not recorded')}"
        + (f"; load average {load[0]:.2f}" if load else ""),
    ])
