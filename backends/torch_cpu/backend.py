"""The torch CPU backend: loads checkpoints into plain tensors and runs them eagerly."""
from __future__ import annotations

import os

import torch

from qwen_serve.checkpoint import Checkpoint
from qwen_serve.config import ModelConfig
from qwen_serve.errors import ModelLoadError

from .kv_storage import TorchKVStorage
from .model import DecoderModel
from .sampler import TorchSampler

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def storage_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


class TorchBackend:
    name = "torch"
    quantizations: tuple[str, ...] = ("none",)

    def __init__(self, num_threads: int | None = None) -> None:
        # One thread per core: more threads only fight over the same cores.
        torch.set_num_threads(num_threads or os.cpu_count() or 1)

    def load_model(self, checkpoint: Checkpoint, dtype: str = "float32", quant: str = "none") -> DecoderModel:
        if quant != "none":
            raise ModelLoadError(f"quantization {quant!r} is not available in the torch backend yet")
        target = storage_dtype(dtype)
        weights = {}
        for name, array in checkpoint.tensors("pt"):
            tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
            weights[name] = tensor.to(target)
        return DecoderModel(checkpoint.config, weights)

    def create_kv_storage(
        self, config: ModelConfig, dtype: str, block_size: int, slab_blocks: int, max_blocks: int
    ) -> TorchKVStorage:
        return TorchKVStorage(
            config.num_layers, config.num_kv_heads, config.head_dim, storage_dtype(dtype),
            block_size, slab_blocks, max_blocks,
        )

    def create_sampler(self) -> TorchSampler:
        return TorchSampler()
