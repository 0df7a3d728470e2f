"""``mlx.core``, imported after its BLAS is bound (see ``blas.py``); every module of this backend
takes ``mx`` from here, so whichever is imported first binds it."""
from .blas import bind_blas

BLAS = bind_blas()  # which BLAS mlx.core multiplies with

import mlx.core as mx  # noqa: E402  (after the binding, which must come first)

__all__ = ["mx", "BLAS"]
