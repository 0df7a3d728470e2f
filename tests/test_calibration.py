"""Calibration for int4: the float model's projections are watched while it reads the
calibration text, and the mean squares of their inputs weigh int4's errors."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from qwen_serve.backends.torch_cpu.backend import TorchBackend
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear
from qwen_serve.backends.torch_cpu.layer_ops import rms_norm
from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.config import EngineConfig
from qwen_serve.engine.builder import build_engine, measure_importance
from qwen_serve.protocols import Calibratable
from qwen_serve.quant import calibration, int4
from qwen_serve.quant.calibration import record_input_importance
from qwen_serve.registry import load_registry

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_weight_name(layer: int, projection: str) -> str:
    """transformers' name of a Llama-family decoder layer's projection."""
    block = "mlp" if projection in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"model.layers.{layer}.{block}.{projection}.weight"


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Every test measures for itself: no importance cached by an earlier run."""
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _float_model(path):
    return TorchBackend().load_model(load_checkpoint(path), "float32", "none")


def _layer0_input(model, ids: list[int]) -> np.ndarray:
    """What layer 0's q/k/v projections see: the normed embeddings, computed here by hand."""
    hidden = model.embed.lookup(torch.tensor(ids))
    return rms_norm(hidden, model.layers[0].input_norm, model.config.rms_norm_eps).numpy()


def test_records_each_projections_mean_squared_input(qwen3_tiny):
    model = _float_model(qwen3_tiny)
    assert isinstance(model, Calibratable)
    layers_before = [(owner, attribute, getattr(owner, attribute)) for _, owner, attribute in model.projections()]
    ids = [5, 17, 300, 2, 9, 41, 7]
    x = torch.tensor(_layer0_input(model, ids))
    importance = record_input_importance(model, lambda: [model.layers[0].mixer.qkv(x), model.layers[0].mixer.qkv(x[:3]),
                                                         model.layers[1].mlp.down_proj(torch.ones(2, 128))])
    expected = np.mean(np.concatenate([x.numpy(), x[:3].numpy()]) ** 2, axis=0)
    qkv = [projection_weight_name(0, name) for name in ("q_proj", "k_proj", "v_proj")]
    assert sorted(importance) == sorted(qkv + [projection_weight_name(1, "down_proj")])
    for name in qkv:  # one merged layer: its parts read the same input
        assert np.allclose(importance[name], expected, rtol=1e-5)
    assert np.array_equal(importance[projection_weight_name(1, "down_proj")], np.ones(128, dtype=np.float32))
    assert all(getattr(owner, attribute) is linear for owner, attribute, linear in layers_before)  # put back


def test_layers_are_put_back_when_the_run_fails(qwen3_tiny):
    model = _float_model(qwen3_tiny)
    before = model.layers[1].mlp.gate_up.linear, model.layers[1].mlp.down_proj

    def failing_run():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        record_input_importance(model, failing_run)
    assert (model.layers[1].mlp.gate_up.linear, model.layers[1].mlp.down_proj) == before


def test_the_calibration_run_covers_every_projection_and_matches_layer0_by_hand(qwen3_tiny):
    checkpoint = load_checkpoint(qwen3_tiny)
    backend = TorchBackend()
    config = EngineConfig(kv_blocks=64)
    importance = measure_importance(backend, checkpoint, "float32", load_registry().kv_cache_factory("paged"), config)
    layers = checkpoint.config.num_layers
    assert sorted(importance) == sorted(projection_weight_name(i, p) for i in range(layers) for p in PROJECTIONS)
    assert all(v.dtype == np.float32 and np.all(v >= 0) and v.any() for v in importance.values())
    # layer 0's input over the whole calibration text, from the embeddings by hand
    from qwen_serve.quant.calibration import calibration_token_lists

    model = _float_model(qwen3_tiny)
    rows = np.concatenate([_layer0_input(model, ids) for ids in calibration_token_lists(checkpoint.tokenizer, 10_000)])
    assert np.allclose(importance[projection_weight_name(0, "k_proj")], np.mean(rows ** 2, axis=0), rtol=1e-4)


def test_int4_engines_quantize_with_the_measured_importance(qwen3_tiny):
    checkpoint = load_checkpoint(qwen3_tiny)
    importance = measure_importance(TorchBackend(), checkpoint, "float32", load_registry().kv_cache_factory("paged"),
                                    EngineConfig(kv_blocks=64))
    name = projection_weight_name(1, "gate_proj")
    weight = dict(checkpoint.tensors("numpy"))[name]
    calibrated = build_engine(str(qwen3_tiny), quant="int4", kv_blocks=64).executor.layers[1].mlp.gate_up.linear
    plain = build_engine(str(qwen3_tiny), quant="int4", kv_blocks=64, calibrate=False).executor.layers[1].mlp.gate_up.linear
    assert isinstance(calibrated, Int4Linear)
    rows = weight.shape[0]  # gate_proj's rows come first in the merged gate/up layer
    expected = int4.quantize(weight, importance[name])
    assert np.array_equal(calibrated.dequantize()[:rows].numpy(), int4.dequantize(expected))
    assert np.array_equal(plain.dequantize()[:rows].numpy(), int4.dequantize(int4.quantize(weight)))
    assert not np.array_equal(calibrated.dequantize().numpy(), plain.dequantize().numpy())


def test_a_short_max_seq_len_still_calibrates(qwen3_tiny):
    """Calibration texts longer than the engine allows are cut, not refused."""
    checkpoint = load_checkpoint(qwen3_tiny)
    config = EngineConfig(kv_blocks=64, max_seq_len=20)
    importance = measure_importance(TorchBackend(), checkpoint, "float32", load_registry().kv_cache_factory("paged"), config)
    assert len(importance) == checkpoint.config.num_layers * len(PROJECTIONS)
    parts = build_engine(str(qwen3_tiny), quant="int4", kv_blocks=64, max_seq_len=20)
    assert isinstance(parts.executor.layers[0].mixer.qkv.linear, Int4Linear)
    # with room for no token before the one generated, there is nothing to read: no calibration
    assert measure_importance(TorchBackend(), checkpoint, "float32", load_registry().kv_cache_factory("paged"),
                              EngineConfig(kv_blocks=64, max_seq_len=1)) is None
    assert isinstance(build_engine(str(qwen3_tiny), quant="int4", max_seq_len=1).executor.layers[0].mixer.qkv.linear, Int4Linear)


class CountingTorchBackend(TorchBackend):
    """The torch backend, counting how often it loads a float model."""

    def __init__(self) -> None:
        super().__init__()
        self.float_loads = 0

    def load_model(self, checkpoint, dtype="float32", quant="none", importance=None):
        self.float_loads += quant == "none"
        return super().load_model(checkpoint, dtype, quant, importance)


def test_importance_is_measured_once_per_model_backend_and_dtype(qwen3_tiny, tmp_path, fresh_cache):
    model_dir = tmp_path / "model"
    shutil.copytree(qwen3_tiny, model_dir)
    backend, paged = CountingTorchBackend(), load_registry().kv_cache_factory("paged")
    config = EngineConfig(kv_blocks=64)

    def measure(dtype="float32"):
        return measure_importance(backend, load_checkpoint(model_dir), dtype, paged, config)

    first, again = measure(), measure()
    assert backend.float_loads == 1 and len(list(fresh_cache.glob("importance/*.npz"))) == 1
    assert sorted(first) == sorted(again) and all(np.array_equal(first[n], again[n]) for n in first)
    measure("bfloat16")  # another dtype is another measurement
    assert backend.float_loads == 2
    weights = model_dir / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # new weights
    measure()
    assert backend.float_loads == 3
    for content in (b"not a zip file", b""):  # unreadable, or cut short by a crash: measured again
        for cached in fresh_cache.glob("importance/*.npz"):
            cached.write_bytes(content)
        assert sorted(measure()) == sorted(first)
    assert backend.float_loads == 5


def test_a_failed_cache_write_leaves_nothing_behind(fresh_cache, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(calibration.np, "savez", disk_full)
    calibration.save_importance("k" * 32, {"w": np.ones(64, dtype=np.float32)})
    assert list((fresh_cache / "importance").iterdir()) == []
    assert calibration.load_importance("k" * 32) is None


def test_non_finite_inputs_give_no_importance(qwen3_tiny):
    model = _float_model(qwen3_tiny)
    x = torch.ones(2, 64)
    x[0, 3] = float("inf")
    importance = record_input_importance(model, lambda: [model.layers[0].mixer.qkv(x), model.layers[0].mlp.down_proj(torch.ones(2, 128))])
    assert sorted(importance) == [projection_weight_name(0, "down_proj")]
