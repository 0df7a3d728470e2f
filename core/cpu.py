"""This CPU as /proc/cpuinfo describes its first processor: model name and flags. One parser for
the two readers: the torch backend choosing its kernels and the benchmarks recording the machine
(kept low in the package so both may import it). Elsewhere than Linux the model name comes from
the platform and the flag list is empty."""
from __future__ import annotations

import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# The flags that decide which kernels a CPU can run; a result names these (all flags are kept too).
KEY_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16")


def first_processor(cpuinfo: str) -> dict[str, str]:
    """The fields of the first processor block of a /proc/cpuinfo text (the first value of a key wins)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@lru_cache(maxsize=1)
def this_processor() -> dict[str, str]:
    """first_processor of this machine, read once: the flags do not change while the process runs,
    and parsing the file every step once took 2% of a single-stream step."""
    try:
        return first_processor(CPUINFO.read_text())
    except OSError:
        return {}


def flags_of(fields: dict[str, str]) -> frozenset[str]:
    """x86 names them "flags", ARM "Features"."""
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def model_name_of(fields: dict[str, str]) -> str:
    return fields.get("model name") or _platform_model_name()


def cpu_flags() -> frozenset[str]:
    return flags_of(this_processor())


def cpu_model() -> str:
    return model_name_of(this_processor())


def key_flags(flags: frozenset[str] | set[str] | list[str]) -> list[str]:
    """The KEY_FLAGS present, in KEY_FLAGS order."""
    return [f for f in KEY_FLAGS if f in flags]


@lru_cache(maxsize=1)
def _platform_model_name() -> str:
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  check=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"
