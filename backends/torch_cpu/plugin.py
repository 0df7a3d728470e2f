"""Registers the torch backend; torch itself is imported only when the backend is chosen."""
from qwen_serve.hookspecs import hookimpl


def _load():
    from .backend import TorchBackend

    return TorchBackend()


@hookimpl
def register_backends(register):
    register("torch", _load, requires=("torch",), extra=None)
