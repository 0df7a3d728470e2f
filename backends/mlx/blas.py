"""Which BLAS mlx[cpu] multiplies with, bound before mlx.core loads.

mlx[cpu]'s Linux wheels bundle the netlib reference BLAS: its sgemm is a plain triple loop,
about 20x slower than OpenBLAS on a prefill-sized matmul here, and it makes a batch of rows
cost what the rows cost one at a time. MLX computes every float32 matmul through
``cblas_sgemm``, so before mlx.core is first imported this module loads OpenBLAS (the
``scipy-openblas32`` wheel, installed with the ``mlx`` extra) and a one-function shim
(``blas_shim.c``, built once per machine into ~/.cache/qwen_serve/mlx-blas) with RTLD_GLOBAL; the
dynamic linker then binds MLX's ``cblas_sgemm`` to the shim. It only works before mlx.core loads
(the binding is made then), which is why every module of this backend takes mlx from ``.mx``.

On macOS MLX uses Accelerate and nothing is done. ``QWEN_SERVE_MLX_BLAS=reference`` keeps the
bundled BLAS; without OpenBLAS or a C compiler it is kept too, with a warning.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

from qwen_serve.cache_dir import cache_dir

log = logging.getLogger("qwen_serve.mlx")
SHIM_SOURCE = Path(__file__).with_name("blas_shim.c")
BLAS_ENV = "QWEN_SERVE_MLX_BLAS"
REFERENCE = "reference BLAS (bundled with mlx[cpu])"


@lru_cache(maxsize=1)
def bind_blas() -> str:
    """Bind MLX's sgemm to OpenBLAS where that helps and can be done; says which BLAS MLX uses."""
    if sys.platform == "darwin":
        return "Accelerate"
    if os.environ.get(BLAS_ENV, "").strip().lower() == "reference":
        return REFERENCE
    if "mlx.core" in sys.modules:
        log.warning("mlx.core was imported before qwen_serve's MLX backend: it keeps its reference BLAS")
        return REFERENCE
    try:
        import scipy_openblas32
    except ImportError:
        log.warning("scipy-openblas32 is not installed: MLX multiplies with its reference BLAS "
                    "(pip install 'qwen-serve[mlx]')")
        return REFERENCE
    try:
        openblas = Path(scipy_openblas32.get_lib_dir()) / f"lib{scipy_openblas32.get_library()}.so"
        ctypes.CDLL(str(openblas), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(_shim()), mode=ctypes.RTLD_GLOBAL)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", None) or b""
        log.warning("binding MLX to OpenBLAS failed, it keeps its reference BLAS: %s %s", error, detail.decode(errors="replace"))
        return REFERENCE
    return f"OpenBLAS {scipy_openblas32.__version__} (scipy-openblas32)"


def sgemm_calls() -> int | None:
    """sgemm calls that went through the shim so far, or None when it is not loaded."""
    if bind_blas() == REFERENCE or sys.platform == "darwin":
        return None
    function = ctypes.CDLL(str(_shim())).qwen_serve_sgemm_calls
    function.restype = ctypes.c_uint64
    return int(function())


@lru_cache(maxsize=1)
def _shim() -> Path:
    """The shim library, built on first use; keyed by its source and the compiler."""
    compiler = _compiler()
    source = SHIM_SOURCE.read_bytes()
    key = hashlib.sha256(" ".join(compiler).encode() + b"\0" + source).hexdigest()[:16]
    library = cache_dir("mlx-blas") / f"libqwen_serve_mlx_blas_{key}.so"
    if not library.exists():
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([*compiler, "-O2", "-shared", "-fPIC", str(SHIM_SOURCE), "-o", str(partial)],
                       check=True, capture_output=True)
        os.replace(partial, library)  # atomic: a concurrent build just writes the same file
    return library


def _compiler() -> list[str]:
    """$CC (which may carry a wrapper, e.g. "ccache gcc"), else the compiler Python was built with,
    else the usual names: the first that is installed."""
    candidates = [shlex.split(os.environ.get("CC", "")), shlex.split(sysconfig.get_config_var("CC") or ""),
                  ["cc"], ["gcc"], ["clang"]]
    for command in candidates:
        if command and shutil.which(command[0]):
            return command
    raise OSError(f"no C compiler to build {SHIM_SOURCE.name}")
