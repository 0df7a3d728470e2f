"""Registers the MLX backend by name so that choosing it without mlx installed says what to
install. The implementation lands with the MLX issue; until then choosing it says so."""
from qwen_serve.errors import PluginUnavailable
from qwen_serve.hookspecs import hookimpl


def _load():
    raise PluginUnavailable("backend 'mlx' is registered but not implemented yet; use --backend torch")


@hookimpl
def register_backends(register):
    register("mlx", _load, requires=("mlx",), extra="mlx")
