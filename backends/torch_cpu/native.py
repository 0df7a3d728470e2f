"""The C++ kernels (``kernels/*.cpp``) as torch operators, and which of them this CPU runs.

Why C++: at decode a linear layer is bound by memory bandwidth, and torch has no kernel that
reads 4-bit weights at that speed; attention over a paged cache needs one that reads blocks
where they lie. The sources are built by ``torch.utils.cpp_extension`` (ninja, the system C++
compiler) into ~/.cache/qwen_serve/kernels (or $QWEN_SERVE_CACHE), keyed by the sources and the
torch version, the first time a model loads on a machine (a minute on 2 cores; later loads
reuse the library). Each kernel carries its own instruction-set attribute, so one library holds
the AVX2 and AVX-512 (with and without VNNI) variants and nothing is compiled for "this" CPU:
the choice is made here at run time from the CPU's flags. ``QWEN_SERVE_DISABLE_ISA`` takes
flags out of that choice (``avx512`` all of AVX-512, ``avx512_vnni``, ``avx512_bf16``, ``amx``,
``avx2`` = no kernels), so tests can run every fallback on any machine. Without a compiler,
without AVX2, or with QWEN_SERVE_NO_NATIVE=1, ``load_kernels()`` is None and every caller keeps a
pure-torch path. The operators run on torch's own OpenMP threads (``at::parallel_for``).
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from qwen_serve.cache_dir import cache_dir
from qwen_serve.cpu import cpu_flags

log = logging.getLogger("qwen_serve.torch")
SOURCE_DIR = Path(__file__).parent / "kernels"
DISABLE_ENV = "QWEN_SERVE_DISABLE_ISA"
AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
# The groups a name in QWEN_SERVE_DISABLE_ISA stands for.
FEATURE_GROUPS = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"),
    "amx": ("amx_tile", "amx_bf16", "amx_int8"),
    "avx2": ("avx2",),
}


@dataclass(frozen=True)
class Kernels:
    """The built operators and the variant this CPU runs: ``isa`` "avx512" (blocked weight
    layouts, paged attention) or "avx2" (the canonical int4 layout); ``vnni`` int8 dot products
    for the int4 kernels, ``bf16`` AVX512-BF16 dot products for the bf16 one (without it the
    bf16 weights are widened to float32)."""

    isa: str
    vnni: bool
    ops: Any  # torch.ops.qwen_serve
    bf16: bool = False

    def op(self, name: str) -> Any:
        """The operator `name` built for this ISA (`name`_avx512 or `name`_avx2), for the kernels
        compiled at both widths."""
        return getattr(self.ops, f"{name}_{self.isa}")

    @property
    def vnni8(self) -> bool:
        """Whether the VNNI kernels of vnni8_avx512.cpp run here (AVX-512 with VNNI): the int6
        table's only kernel."""
        return self.isa == "avx512" and self.vnni

    @property
    def int8_activations(self) -> bool:
        """Whether the int4 and int8 decode kernels round the activations to int8 per group of 64
        (~0.6% relative error on a matmul; int16 otherwise, ~1e-4): the VNNI kernels, and AVX2's
        (vpmaddubsw)."""
        return self.vnni if self.isa == "avx512" else True


def disabled_features() -> frozenset[str]:
    names = [n.strip().lower() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
    return frozenset(f for n in names for f in FEATURE_GROUPS.get(n, (n,)))


def cpu_features() -> frozenset[str]:
    """The CPU's flags (as /proc/cpuinfo names them) less those disabled by the environment."""
    return cpu_flags() - disabled_features()


def has_fast_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): there a bf16 GEMM runs
    faster than float32; without them it runs ~100x slower, so float32 it is."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_features())


def load_kernels() -> Kernels | None:
    """The kernels for this CPU and environment, or None when they cannot be built or run."""
    if os.environ.get("QWEN_SERVE_NO_NATIVE"):
        return None
    return _select(cpu_features())


@lru_cache(maxsize=None)
def _select(features: frozenset[str]) -> Kernels | None:
    if all(f in features for f in AVX512):
        isa = "avx512"
    elif {"avx2", "fma", "f16c"} <= features:
        isa = "avx2"
    else:
        return None
    ops = _library()
    return None if ops is None else Kernels(isa, "avx512_vnni" in features, ops, isa == "avx512" and "avx512_bf16" in features)


def _sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h", ".inc"))


@lru_cache(maxsize=1)
def build_key() -> str:
    """The kernels' build: a digest of their sources and torch's version."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in _sources():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def _library() -> Any | None:
    import torch

    if shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None and not _ninja_module():
        log.warning("no C++ compiler or ninja: the torch backend runs its pure-torch fallbacks")
        return None
    name = f"qwen_serve_kernels_{build_key()}"
    build_dir = cache_dir("kernels") / name
    library = build_dir / f"{name}.so"
    try:
        if library.exists():
            torch.ops.load_library(str(library))
        else:
            from torch.utils import cpp_extension

            build_dir.mkdir(parents=True, exist_ok=True)
            with _build_lock(build_dir):
                cpp_extension.load(name=name, sources=[str(p) for p in _sources() if p.suffix == ".cpp"],
                                   extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                                   build_directory=str(build_dir), is_python_module=False, verbose=False)
    except (OSError, RuntimeError, ImportError) as error:  # a failed build: fall back, say why once
        log.warning("building the torch backend's kernels failed, using pure-torch fallbacks: %s", str(error)[-2000:])
        return None
    return torch.ops.qwen_serve


@contextmanager
def _build_lock(build_dir: Path):
    """One build per directory at a time, under a lock the kernel drops with its holder.
    torch's own lock is a plain file that a build killed midway (Ctrl-C on the first start)
    leaves behind, and every later load would wait on it forever; under this lock a file left
    there belongs to no live build, so it goes."""
    with open(build_dir / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ninja_module() -> bool:
    from torch.utils import cpp_extension

    return cpp_extension.is_ninja_available()
