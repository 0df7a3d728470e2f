"""The int8 KV cache plugin (qwen_serve.plugins.int8_kv): its byte count against the formula of
the memory arithmetic, its quantization, its logits against the float cache on real and random weights, the
block-accounting state machine on it, and how it is found (storage format hook)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qwen_serve import LLM
from qwen_serve.conformance.kv_agreement import MAX_DELTA_OF_SPREAD, MIN_TOP1, logit_agreement
from qwen_serve.conformance.prompts import SYSTEM_PROMPT
from qwen_serve.errors import PluginUnavailable
from qwen_serve.hookspecs import hookimpl
from qwen_serve.plugins.int8_kv import torch_storage
from qwen_serve.plugins.int8_kv.cache import PagedInt8KVCache
from qwen_serve.plugins.int8_kv.torch_storage import TorchInt8KVStorage, quantize_rows
from qwen_serve.protocols import Forking, KVCache, KVStorage, LossyKV, PrefixCaching
from qwen_serve.registry import load_registry, make_plugin_manager
from qwen_serve.server.memory_plan import format_memory_plan

try:  # works whether or not tests/ is a package, and under --import-mode=importlib
    from .test_block_accounting import BS, LAYERS, SLAB, PagedCacheMachine, _machine_settings
except ImportError:
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_block_accounting import BS, LAYERS, SLAB, PagedCacheMachine, _machine_settings


# ------------------------------------------------------------------------------------------
# Bytes
# ------------------------------------------------------------------------------------------
def test_bytes_per_token_equal_the_formula_and_the_arrays():
    # Qwen3-0.6B: 28 layers, 8 kv heads, head_dim 128; per row 128 int8 codes + one float32 scale
    storage = TorchInt8KVStorage(28, 8, 128, block_size=16, slab_blocks=2, max_blocks=4)
    assert storage.bytes_per_token() == 2 * 28 * 8 * (128 * 1 + 4) == 59_136
    bf16 = 2 * 28 * 8 * 128 * 2
    assert round(bf16 / storage.bytes_per_token(), 2) == 1.94  # not 2x: the scales cost 4 B a row
    assert storage.nbytes() == 0
    storage.ensure_blocks(1)  # one slab of 2 blocks of 16 tokens
    assert storage.nbytes() == 2 * 16 * storage.bytes_per_token()  # the arrays hold exactly that


def test_mlx_storage_counts_the_same_bytes():
    mlx_storage = pytest.importorskip("qwen_serve.plugins.int8_kv.mlx_storage")
    storage = mlx_storage.MLXInt8KVStorage(28, 8, 128, block_size=16, slab_blocks=2, max_blocks=4)
    assert storage.bytes_per_token() == 2 * 28 * 8 * (128 + 4)
    storage.ensure_blocks(1)
    assert storage.nbytes() == 2 * 16 * storage.bytes_per_token()


def test_startup_plan_shows_the_int8_bytes(qwen3_tiny):
    # qwen3_tiny: 2 layers, 2 kv heads, head_dim 16 -> 2 x 2 x 2 x (16 + 4) = 160 B/token (float32: 512)
    llm = LLM(str(qwen3_tiny), kv_cache="paged-int8")
    plan = format_memory_plan(llm.parts, "float32", "none")
    assert "160 B/token" in plan and "TorchInt8KVStorage" in plan, plan
    assert f"pool 512 blocks = {160 * 16 * 512 / 2**20:.1f} MiB" in plan, plan


# ------------------------------------------------------------------------------------------
# Quantization
# ------------------------------------------------------------------------------------------
def test_rows_round_trip_within_half_a_step():
    x = torch.randn(64, 4, 32) * torch.logspace(-3, 2, 64)[:, None, None]  # rows of very different size
    x[3] = 0  # an all-zero row stays zero (no division by a zero scale)
    codes, scale = quantize_rows(x)
    assert codes.dtype == torch.int8 and scale.shape == (64, 4) and scale.dtype == torch.float32
    error = (codes.float() * scale[..., None] - x).abs()
    assert bool((error <= scale[..., None] / 2 + 1e-7).all())
    assert bool((codes[3] == 0).all()) and float(scale[3].abs().max()) == 0.0
    assert int(codes.abs().max()) == 127  # each row's largest magnitude uses the full range


def test_storage_reads_what_it_was_written_approximately():
    storage = TorchInt8KVStorage(2, 2, 8, block_size=4, slab_blocks=2, max_blocks=8)
    storage.ensure_blocks(3)
    keys, values = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    slots = torch.tensor([0, 1, 2, 5, 9, 10])
    storage.write(1, slots, keys, values)
    k, v = storage.read(1, slots.view(2, 3))
    assert k.shape == (2, 3, 2, 8) and k.dtype == torch.float32
    for got, want in ((k.reshape(6, 2, 8), keys), (v.reshape(6, 2, 8), values)):
        step = want.abs().amax(-1, keepdim=True) / 127
        assert bool(((got - want).abs() <= step / 2 + 1e-7).all())
    storage.copy_block(0, 3)  # copy-on-write copies codes and scales alike
    k3, _ = storage.read(1, torch.arange(12, 15))
    assert torch.equal(k3, storage.read(1, torch.arange(0, 3))[0])


# ------------------------------------------------------------------------------------------
# Logits against the float cache (the bound of conformance check 2)
# ------------------------------------------------------------------------------------------
def chat_prompts(llm):
    return [llm.tokenizer.encode_chat(c) for c in (
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "When do you open on Saturday?"}],
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "How much is colour printing?"}],
        [{"role": "user", "content": "Write a haiku about the sea."}],
    )]


@pytest.mark.parametrize("model, backend", [("smollm2_path", "torch"), ("qwen3_06b_like", "torch"),
                                            ("qwen3_06b_like", "mlx")])
def test_logits_stay_within_the_bound_of_the_float_cache(model, backend, request):
    if backend == "mlx":
        pytest.importorskip("qwen_serve.backends.mlx.mx")
    path = str(request.getfixturevalue(model))
    exact = LLM(path, backend=backend, kv_cache="paged", chunk_size=64)
    lossy = LLM(path, backend=backend, kv_cache="paged-int8", chunk_size=64)
    result = logit_agreement(exact, lossy, chat_prompts(exact), 16)
    print(f"{model} on {backend}: {result.describe()}")
    assert result.top1 >= MIN_TOP1
    assert result.max_abs_delta <= MAX_DELTA_OF_SPREAD * result.logit_spread
    assert result.max_abs_delta > 0  # int8 is really in the path
    assert lossy.parts.cache.usage().prefix_hit_blocks > 0  # the second prompt read int8 blocks by reference


def test_a_coarser_format_breaks_the_bound(qwen3_06b_like, monkeypatch):
    """The bound is not vacuous: the same storage with 7 levels (4 bits) fails it."""
    exact = LLM(str(qwen3_06b_like), kv_cache="paged", chunk_size=64)
    monkeypatch.setattr(torch_storage, "LEVELS", 7)
    coarse = LLM(str(qwen3_06b_like), kv_cache="paged-int8", chunk_size=64)
    assert not logit_agreement(exact, coarse, chat_prompts(exact), 16).within_bound


@pytest.fixture(scope="module")
def qwen3_06b_like(tmp_path_factory):
    """A random Qwen3 with Qwen3-0.6B's head_dim 128 and GQA 2:1, small enough to be cheap."""
    from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint

    geometry = Qwen3Geometry(num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=128)
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-hd128"), geometry, seed=5)


# ------------------------------------------------------------------------------------------
# Block accounting: the paged state machine, run on the int8 cache and storage
# ------------------------------------------------------------------------------------------
class NumpyFacingStorage:
    """The real torch int8 storage behind the numpy interface the state machine speaks, counting
    copy-on-write copies as the machine's own storage does."""

    def __init__(self, storage: TorchInt8KVStorage) -> None:
        self.inner = storage
        self.copy_calls = 0

    @property
    def bytes_per_block(self) -> int:
        return self.inner.bytes_per_token() * self.inner.block_size

    def ensure_blocks(self, num_blocks: int) -> None:
        self.inner.ensure_blocks(num_blocks)

    def write(self, layer, slots, keys, values) -> None:
        self.inner.write(layer, torch.as_tensor(np.asarray(slots)), torch.from_numpy(np.asarray(keys)),
                         torch.from_numpy(np.asarray(values)))

    def read(self, layer, slots):
        k, v = self.inner.read(layer, torch.as_tensor(np.asarray(slots)))
        return k.numpy(), v.numpy()

    def copy_block(self, src: int, dst: int) -> None:
        self.copy_calls += 1
        self.inner.copy_block(src, dst)

    def nbytes(self) -> int:
        return self.inner.nbytes()

    def bytes_per_token(self) -> int:
        return self.inner.bytes_per_token()


class Int8PagedCacheMachine(PagedCacheMachine):
    def make_storage(self, num_blocks):
        return NumpyFacingStorage(TorchInt8KVStorage(LAYERS, 1, 2, BS, SLAB, num_blocks))

    def make_cache(self, storage, num_blocks):
        return PagedInt8KVCache(storage, BS, num_blocks, prefix_caching=self.PREFIX_CACHING)


TestInt8PagedCacheMachine = Int8PagedCacheMachine.TestCase
TestInt8PagedCacheMachine.settings = _machine_settings


# ------------------------------------------------------------------------------------------
# Plugin wiring
# ------------------------------------------------------------------------------------------
def test_declares_its_abilities():
    storage = TorchInt8KVStorage(1, 1, 4, 4, 1, 4)
    cache = PagedInt8KVCache(storage, 4, 4)
    assert isinstance(storage, KVStorage) and isinstance(cache, KVCache)
    assert isinstance(cache, LossyKV) and cache.exact_counterpart == "paged"
    assert isinstance(cache, PrefixCaching) and isinstance(cache, Forking)


def test_a_backend_without_int8_storage_is_a_one_line_error():
    class OtherBackend:
        @staticmethod
        @hookimpl
        def register_backends(register):
            register("other", lambda: None)

    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    pm.register(OtherBackend, name="other-backend")
    try:
        registry = load_registry(pm=pm)
        assert registry.kv_storage_entry("paged", "other") is None  # the backend's own storage
        with pytest.raises(PluginUnavailable) as exc:
            registry.kv_storage_entry("paged-int8", "other")
        message = str(exc.value)
        assert "\n" not in message and "int8" in message and "mlx, torch" in message
    finally:
        pm.unregister(name="other-backend")
