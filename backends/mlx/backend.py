"""The MLX backend: the torch backend's semantics on MLX arrays (on Linux through mlx[cpu]).

Weights are stored in the chosen dtype and computed in float32, or, with quant "int4", kept as
4-bit codes from the canonical format (``qwen_serve.quant.int4``) and multiplied by
mx.quantized_matmul. Norms always stay float32.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import numpy as np

from qwen_serve.checkpoints.checkpoint import Checkpoint
from qwen_serve.errors import require_choice
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.weights import TABLE_NAMES, is_projection
from qwen_serve.quant import int4

from .blas import REFERENCE
from .kv_storage import MLXKVStorage
from .linear import DenseLinear, QuantizedLinear
from .model import DecoderModel
from .mx import BLAS, mx
from .sampler import MLXSampler
from .state_storage import MLXStateStorage

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def storage_dtype(name: str) -> mx.Dtype:
    require_choice("dtype", name, DTYPES)
    return DTYPES[name]


class MLXBackend:
    name = "mlx"
    quantizations: tuple[str, ...] = ("none", "int4")
    blas = BLAS  # which BLAS mlx.core multiplies float32 with (see blas.py)
    # With mlx[cpu]'s bundled reference BLAS (~4 GFLOP/s measured here, torch 70-110) a batch of
    # 8 rows costs about what 8 single rows do (conformance check 3).
    serial_compute = None if BLAS != REFERENCE else (
        "mlx[cpu] off macOS multiplies with a reference BLAS: a batch costs about as much as its rows one at a time")

    def load_model(self, checkpoint: Checkpoint, dtype: str = "float32", quant: str = "none",
                   importance: Mapping[str, np.ndarray] | None = None) -> DecoderModel:
        require_choice("quantization", quant, self.quantizations, where=f" for the {self.name} backend")
        target = storage_dtype(dtype)
        weights = {}
        as_int4 = is_projection if quant == "int4" else None
        for name, array in checkpoint_arrays(checkpoint, as_int4):  # one at a time: the float model never exists whole
            if isinstance(array, int4.Int4Weight):  # converted from the file's own 4-bit blocks
                weights[name] = QuantizedLinear.from_canonical(array)
                continue
            weight = array.astype(target) if array.ndim > 1 else array
            mx.eval(weight)  # materialize now, not lazily inside the first request
            weights[name] = _quantize(name, weight, (importance or {}).get(name)) if quant == "int4" else weight
        return DecoderModel(checkpoint.config, weights, _as_linear)

    def create_kv_storage(
        self, config: ModelConfig, dtype: str, block_size: int, slab_blocks: int, max_blocks: int
    ) -> MLXKVStorage:
        return MLXKVStorage(config.kv_layers, config.num_kv_heads, config.head_dim, storage_dtype(dtype),
                            block_size, slab_blocks, max_blocks)

    def create_state_storage(self, config: ModelConfig, max_slots: int) -> MLXStateStorage:
        """HoldsRecurrentState: the linear-attention layers' states of up to max_slots sequences."""
        return MLXStateStorage(config.linear_attention(), max_slots)

    def create_sampler(self) -> MLXSampler:
        return MLXSampler()


def checkpoint_arrays(checkpoint: Checkpoint, as_int4: Callable[[str], bool] | None = None
                      ) -> Iterator[tuple[str, mx.array | int4.Int4Weight]]:
    """(name, mx.array) pairs, one at a time (an Int4Weight where as_int4 asks and the file allows:
    Checkpoint.tensors). safetensors' "mlx" framework goes through numpy, which has no bfloat16
    (the dtype real Qwen3 checkpoints ship in); such files go through torch."""
    done = set()
    try:
        for name, array in checkpoint.tensors("mlx", as_int4):
            yield name, array if isinstance(array, int4.Int4Weight) else _to_mlx(array)
            done.add(name)
        return
    except TypeError as exc:
        if "bfloat16" not in str(exc):
            raise
    import torch  # a dependency of qwen-serve itself; used only to read bfloat16 safetensors

    for name, tensor in checkpoint.tensors("pt"):
        if name not in done:
            yield name, mx.array(tensor.to(torch.float32).numpy())


def _to_mlx(array: Any) -> mx.array:
    return array if isinstance(array, mx.array) else mx.array(np.asarray(array))


def _quantize(name: str, weight: mx.array, importance: np.ndarray | None) -> mx.array | QuantizedLinear:
    """Projections become int4 (the canonical format, then MLX's kernel); the embedding / head
    int8, as on the torch backend: an int4 table cost 6 points of check 6 on SmolLM2 (77.6% vs
    83%). Norms, and widths that are not whole groups, stay float."""
    if name in TABLE_NAMES and weight.shape[-1] % int4.GROUP == 0:
        return QuantizedLinear.int8(weight)
    if is_projection(name) and int4.can_quantize(weight.shape):
        return QuantizedLinear.from_canonical(int4.quantize(np.array(weight.astype(mx.float32)), importance))
    return weight


def _as_linear(weight: mx.array | QuantizedLinear, bias: mx.array | None) -> DenseLinear | QuantizedLinear:
    """A float weight becomes a DenseLinear; a layer quantized while loading is used as is."""
    if isinstance(weight, QuantizedLinear):
        weight.bias = None if bias is None else bias.astype(mx.float32)
        return weight
    return DenseLinear(weight, bias)
