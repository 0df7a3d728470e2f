"""The torch CPU backend: loads checkpoints into plain tensors and runs them eagerly.

With quant "int4" each projection is quantized to the canonical int4 format as its tensor
arrives (one float tensor alive at a time), weighted by the calibration importance the builder
measured with the float model beforehand, and the embedding, which a tied lm_head shares, becomes
int8 rows: on SmolLM2 an int8 table measured 83.2% top-5 agreement with float against 83.7% for a
float table and 77.1% for an int4 one, which would save 65 MB more on Qwen3-0.6B
(``python benchmarks/bench_quant.py --only quality``).
"""
from __future__ import annotations

import functools
import os
from typing import Mapping

import numpy as np
import torch

from qwen_serve.checkpoints.checkpoint import Checkpoint
from qwen_serve.errors import require_choice
from qwen_serve.heap import return_free_heap
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.weights import TABLE_NAMES, is_projection
from qwen_serve.quant import int4

from .int4_linear import Int4Linear, Int6Linear, Int8Linear, quantizable
from .kv_storage import TorchKVStorage
from .linear import DenseLinear
from .model import DecoderModel
from .native import load_kernels
from .sampler import TorchSampler
from .state_storage import TorchStateStorage
from .tiles import Scratch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = ("none", "int4")
HEAD_QUANTS = ("auto", "none", "int8", "int6", "int4")


def storage_dtype(name: str) -> torch.dtype:
    require_choice("dtype", name, DTYPES)
    return DTYPES[name]


class TorchBackend:
    name = "torch"
    quantizations = QUANTIZATIONS

    def __init__(self, num_threads: int | None = None, head_quant: str = "auto") -> None:
        # One thread per core this process may run on (its affinity mask, which taskset and cgroup
        # CPU sets narrow): more threads only fight over the same cores. OMP_NUM_THREADS, when set,
        # is this process's share of them (Ray sets it to a replica's CPUs). torch's OpenMP pool is
        # also the kernels' (native.py), so this is the one thread count of every computation.
        torch.set_num_threads(num_threads or _threads_from_env() or len(os.sched_getaffinity(0)) or 1)
        if head_quant not in HEAD_QUANTS:
            raise ValueError(f"head_quant must be one of {', '.join(HEAD_QUANTS)}, got {head_quant!r}")
        # How the embedding / lm_head is stored under quant "int4". "auto": int6 where its VNNI
        # kernel runs (397 MB a token on Qwen3.5-2B's head instead of int8's 510), int8 elsewhere.
        kernels = load_kernels()
        self.head_quant = head_quant if head_quant != "auto" else "int6" if kernels and kernels.vnni8 else "int8"

    def load_model(self, checkpoint: Checkpoint, dtype: str = "float32", quant: str = "none",
                   importance: Mapping[str, np.ndarray] | None = None) -> DecoderModel:
        require_choice("quantization", quant, self.quantizations, where=f" for the {self.name} backend")
        target = storage_dtype(dtype)
        scratch = Scratch()  # one dequantization buffer for the whole model
        weights = {}
        for name, array in checkpoint.tensors("pt", as_int4=lambda name: self._storage(name, quant) == "int4"):
            if isinstance(array, int4.Int4Weight):  # converted from the file's own 4-bit blocks
                weights[name] = array
                continue
            tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
            weights[name] = self._convert(name, tensor, target, quant, scratch, (importance or {}).get(name))
            if quant != "none":
                # The float temporaries of this tensor go back to the OS: the small kept int4
                # arrays pin glibc's heap between them, and quantizing Qwen3-0.6B left ~800 MiB of
                # freed memory resident (1.5 GiB RSS for 385 MiB of weights).
                del tensor, array
                return_free_heap()
        model = DecoderModel(checkpoint.config, weights, make_linear=functools.partial(_as_linear, scratch=scratch))
        if quant != "none":
            return_free_heap()  # and the temporaries of merging the projections (merged_linear.py)
        return model

    def _convert(self, name: str, tensor: torch.Tensor, target: torch.dtype, quant: str, scratch: Scratch,
                 importance: np.ndarray | None = None):
        if quant == "int4":
            kind = self._storage(name, quant)
            if kind == "int4" and quantizable(tensor):  # canonical: the layer is made once merged (_as_linear)
                return int4.quantize(tensor.float().numpy(), importance)
            if kind == "int6" and quantizable(tensor):
                return Int6Linear(tensor, scratch=scratch)
            if kind in ("int6", "int8"):  # int6 needs whole groups of 64 inputs
                return Int8Linear(tensor, scratch=scratch)
        return tensor.to(target)

    def _storage(self, name: str, quant: str) -> str:
        """How the tensor `name` is held under `quant`: "int4", "int6", "int8" or "none" (as loaded)."""
        if quant != "int4":
            return "none"
        return self.head_quant if name in TABLE_NAMES else "int4" if is_projection(name) else "none"

    def create_kv_storage(
        self, config: ModelConfig, dtype: str, block_size: int, slab_blocks: int, max_blocks: int
    ) -> TorchKVStorage:
        return TorchKVStorage(
            config.kv_layers, config.num_kv_heads, config.head_dim, storage_dtype(dtype),
            block_size, slab_blocks, max_blocks,
        )

    def create_state_storage(self, config: ModelConfig, max_slots: int) -> TorchStateStorage:
        """HoldsRecurrentState: float32 states of every linear-attention layer."""
        return TorchStateStorage(config.linear_attention(), max_slots)

    def preferred_kv_dtype(self, dtype: str) -> tuple[str, str]:
        """bfloat16 keys and values where the kernels (AVX-512 or AVX2) write them and attend over
        them in place, widening to float32 in registers: a decode step reads half the bytes per
        cached token. Elsewhere the generic path would copy them to float32 on every read."""
        if dtype != "float32":
            return dtype, "auto: the weights' dtype"
        kernels = load_kernels()
        if kernels is not None:
            return "bfloat16", f"auto: the {kernels.isa.upper()} attention reads bf16 in place, half the bytes of float32"
        return "float32", "auto: no attention kernel here to read bf16 in place"

    def create_sampler(self) -> TorchSampler:
        return TorchSampler()


def _threads_from_env() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _as_linear(weight, bias, scratch: Scratch):
    """A float tensor becomes a DenseLinear, an int4 one an Int4Linear; a layer quantized while
    loading (int8) is used as is."""
    if isinstance(weight, torch.Tensor):
        return DenseLinear(weight, bias, scratch)
    if isinstance(weight, int4.Int4Weight):
        return Int4Linear(weight, None if bias is None else bias.float(), scratch=scratch)
    if bias is not None:
        weight.bias = bias.float()
    return weight
