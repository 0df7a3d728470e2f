"""Registers the MLX backend by name; mlx itself is imported only when the backend is chosen,
so selecting it without mlx installed gives the one-line error naming the extra to install."""
from qwen_serve.hookspecs import hookimpl


def _load():
    from .backend import MLXBackend

    return MLXBackend()


@hookimpl
def register_backends(register):
    register("mlx", _load, requires=("mlx",), extra="mlx")
