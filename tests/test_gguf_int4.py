"""GGUF Q4_0 projections become int4 straight from their blocks (quant.from_q4_0): the larger block
of each group of 64 is kept exactly, the whole tensor is no further from the file's weights than
the int4 search would put it, and a Q4_0 file served with --quant int4 quantizes nothing."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.gguf_writer import Q4_0, write_gguf
from qwen_serve.conformance.models import MoeRouting, make_qwen3_moe_checkpoint
from qwen_serve.quant import int4
from qwen_serve.quant.from_q4_0 import BLOCK, BLOCK_BYTES, int4_from_q4_0

Q4 = gguf.GGMLQuantizationType.Q4_0


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_larger_block_of_each_group_is_kept_and_the_rest_is_as_close_as_the_search(seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((96, 512)) * 0.02 * rng.uniform(0.2, 3.0, (96, 1))).astype(np.float32)
    raw = quantize(w, Q4)
    stored = dequantize(raw, Q4)  # what llama.cpp multiplies by
    got = int4.dequantize(int4_from_q4_0(raw, w.shape))
    d = np.abs(raw.reshape(96, -1, BLOCK_BYTES)[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    pairs = d.reshape(96, -1, 2)
    larger = np.repeat(pairs.argmax(axis=-1)[..., None] == np.arange(2), BLOCK, axis=-1).reshape(96, -1)
    step = np.repeat(pairs.max(axis=-1), 2 * BLOCK, axis=-1)
    assert np.all(np.abs(got - stored)[larger] <= 3.5e-3 * step[larger])  # float16's rounding of -7|d| only
    assert np.all(np.abs(got - stored)[~larger] <= 1.0035 * step[~larger])  # rounded, or clipped at 7|d| or -7|d|
    searched = int4.dequantize(int4.quantize(stored))
    assert relative_error(got, stored) <= 1.02 * relative_error(searched, stored)


def test_a_negative_scale_block_is_kept_too():
    """d < 0 (the block's largest weight positive): codes run the other way, zero -7|d|."""
    w = np.linspace(-0.5, 1.0, 64, dtype=np.float32)[None, :].repeat(2, axis=0)
    raw = quantize(w, Q4)
    d = raw.reshape(2, 2, BLOCK_BYTES)[..., :2].copy().view(np.float16)[..., 0]
    assert np.all(d[:, 1] < 0) and np.all(np.abs(d[:, 1]) > np.abs(d[:, 0]))  # the second block sets the grid
    got = int4.dequantize(int4_from_q4_0(raw, w.shape))
    np.testing.assert_allclose(got[:, BLOCK:], dequantize(raw, Q4)[:, BLOCK:], rtol=0, atol=3.5e-3 * 0.125)


@pytest.fixture(scope="module")
def q4_0_moe(tmp_path_factory):
    routing = MoeRouting(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)  # int4-wide experts
    hf_dir = make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("qwen3-moe"), routing, seed=13)
    return write_gguf(hf_dir, tmp_path_factory.mktemp("gguf") / "qwen3-moe-q4_0.gguf", Q4_0)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_q4_0_file_served_as_int4_quantizes_no_projection(q4_0_moe, backend, monkeypatch):
    searched = []
    search = int4.quantize
    monkeypatch.setattr(int4, "quantize", lambda weight, *args: searched.append(weight.shape) or search(weight, *args))
    llm = LLM(str(q4_0_moe), backend=backend, quant="int4")
    assert searched == []
    out = llm.generate([llm.tokenizer.encode("The quick brown fox")], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8
    if backend == "torch":  # the served expert is the file's blocks converted, gate and up merged
        reader = {t.name: t for t in gguf.GGUFReader(str(q4_0_moe)).tensors}
        parts = [int4.dequantize(int4_from_q4_0(reader[f"blk.1.ffn_{p}_exps.weight"].data[2], (64, 64)))
                 for p in ("gate", "up")]
        served = llm.parts.executor.layers[1].mlp.experts[2].gate_up.linear.dequantize()
        torch.testing.assert_close(served, torch.from_numpy(np.concatenate(parts)), rtol=0, atol=0)
