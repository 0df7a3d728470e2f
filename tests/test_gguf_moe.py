"""GGUF files of Qwen3-MoE (llama.cpp's `qwen3moe`) and Qwen3: a tiny random checkpoint written by
transformers, converted by conformance's GGUF writer, loads in qwen-serve with the same layers and
the same greedy tokens as transformers on the HF directory; quantized experts are read one
expert at a time from their own blocks."""
from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from safetensors import safe_open

from qwen_serve import LLM, SamplingParams
from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.conformance.gguf_writer import Q4_0, Q8_0, write_gguf
from qwen_serve.conformance.models import MoeRouting, make_qwen3_checkpoint, make_qwen3_moe_checkpoint
from qwen_serve.conformance.reference import hf_greedy

NEW_TOKENS = 10
ROUTING = MoeRouting(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("qwen3-moe"), ROUTING, seed=11)


@pytest.fixture(scope="module")
def moe_gguf(moe_dir, tmp_path_factory):
    return write_gguf(moe_dir, tmp_path_factory.mktemp("gguf") / "qwen3-moe-f32.gguf")


@pytest.fixture(scope="module")
def moe_gguf_checkpoint(moe_gguf):
    return load_checkpoint(moe_gguf)


@pytest.fixture(scope="module")
def moe_q8_gguf(moe_dir, tmp_path_factory):
    return write_gguf(moe_dir, tmp_path_factory.mktemp("gguf") / "qwen3-moe-q8_0.gguf", Q8_0)


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3"), seed=12)


@lru_cache(maxsize=None)
def reference(path, prompt: tuple[int, ...]) -> list[int]:
    return hf_greedy(path, list(prompt), NEW_TOKENS)


def assert_greedy_equals_transformers(gguf_path, hf_dir, backend):
    llm = LLM(str(gguf_path), backend=backend, chunk_size=32)
    prompts = [llm.tokenizer.encode("The quick brown fox"),
               llm.tokenizer.encode(" ".join(f"word{i}" for i in range(30)))]  # longer than a chunk of 32
    assert len(prompts[1]) > 32
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference(hf_dir, tuple(prompt))
    assert len(set(outs[1].token_ids)) > 3, "a random model should produce varied tokens"


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_moe_gguf_greedy_equals_transformers(moe_gguf, moe_dir, backend):
    assert_greedy_equals_transformers(moe_gguf, moe_dir, backend)


def test_dense_qwen3_gguf_greedy_equals_transformers(dense_dir, tmp_path):
    """The writer itself, on the architecture llama.cpp's own files of which load here already
    (each GGUF load of Qwen's 151,936-token vocabulary takes ~9 s, so one backend)."""
    assert_greedy_equals_transformers(write_gguf(dense_dir, tmp_path / "qwen3.gguf"), dense_dir, "torch")


def test_the_gguf_config_describes_the_same_layers(moe_gguf_checkpoint, moe_dir):
    from_gguf, from_json = moe_gguf_checkpoint.config, load_checkpoint(moe_dir).config
    assert from_gguf.layers == from_json.layers
    assert from_gguf.parameters() == from_json.parameters()
    assert from_gguf.layers[0].mlp.num_experts == 4


def test_the_tokenizer_is_the_checkpoints(moe_gguf_checkpoint, moe_dir):
    text = "<|im_start|>user\nMixture of experts, 1234 <think>ok</think><|im_end|>"
    assert moe_gguf_checkpoint.tokenizer.encode(text) == load_checkpoint(moe_dir).tokenizer.encode(text)


def test_quantized_experts_come_one_at_a_time_from_their_own_blocks(moe_q8_gguf):
    """Each expert equals its slice of the whole dequantized stack, with the expert's 2-D shape."""
    stacks = {t.name: t for t in gguf.GGUFReader(str(moe_q8_gguf)).tensors if "_exps" in t.name}
    assert {t.tensor_type for t in stacks.values()} == {gguf.GGMLQuantizationType.Q8_0}
    experts = {name: array for name, array in load_checkpoint(moe_q8_gguf).tensors() if ".experts." in name}
    assert len(experts) == 2 * 4 * 3  # layers x experts x projections
    whole = dequantize(stacks["blk.1.ffn_down_exps.weight"].data, gguf.GGMLQuantizationType.Q8_0)
    assert whole.shape == (4, 64, 32)  # [experts, hidden, moe_intermediate_size]
    for expert in range(4):
        np.testing.assert_array_equal(experts[f"model.layers.1.mlp.experts.{expert}.down_proj.weight"], whole[expert])
    hidden, width = 64, ROUTING.moe_intermediate_size
    assert experts["model.layers.0.mlp.experts.3.gate_proj.weight"].shape == (width, hidden)
    assert experts["model.layers.0.mlp.experts.3.down_proj.weight"].shape == (hidden, width)


@pytest.mark.parametrize("tensor_type, backend", [("Q8_0", "torch"), ("Q4_0", "mlx")])
def test_a_quantized_moe_gguf_loads_and_generates(moe_q8_gguf, moe_dir, tmp_path, tensor_type, backend):
    path = moe_q8_gguf if tensor_type == "Q8_0" else write_gguf(moe_dir, tmp_path / "q4_0.gguf", Q4_0)
    llm = LLM(str(path), backend=backend)
    out = llm.generate([llm.tokenizer.encode("The quick brown fox")], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


def test_a_random_gguf_written_as_q4_0_blocks_loads_with_its_geometry(moe_dir, tmp_path):
    """write_random_gguf (the 30B-A3B benchmark's file) gives a file of config.json's geometry
    whose weights have the standard deviation asked for, and which the loader reads as any other."""
    import json

    from qwen_serve.conformance.gguf_writer import write_random_gguf

    config = json.loads((moe_dir / "config.json").read_text())
    path = write_random_gguf(config, moe_dir, tmp_path / "random.gguf", seed=3, scale=0.05)
    checkpoint = load_checkpoint(path)
    tensors = dict(checkpoint.tensors())
    with safe_open(moe_dir / "model.safetensors", "numpy") as weights:  # what transformers wrote
        expected = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    assert {name: tuple(t.shape) for name, t in tensors.items()} == expected
    experts = np.concatenate([t.ravel() for name, t in tensors.items() if ".experts." in name])
    assert experts.std() == pytest.approx(0.05, rel=0.05) and abs(experts.mean()) < 0.01
    assert all(np.all(t == 1) for name, t in tensors.items() if name.endswith("norm.weight"))


def mapped_kib(path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTNEED"), reason="no madvise here")
def test_the_files_pages_leave_the_process_once_read(moe_q8_gguf):
    """Read tensors' pages are dropped from the process (the page cache keeps them): else the
    whole file would count in the server's RSS for its life, beside the weights made from it."""
    size_kib = moe_q8_gguf.stat().st_size // 1024
    checkpoint = load_checkpoint(moe_q8_gguf)
    tensors = checkpoint.tensors()
    first = [next(tensors) for _ in range(3)]
    assert first and mapped_kib(moe_q8_gguf) > 0
    rest = list(tensors)
    assert len(rest) > 20
    assert mapped_kib(moe_q8_gguf) < 0.1 * size_kib
    again = dict(checkpoint.tensors())  # a later read faults the pages back in from the file
    np.testing.assert_array_equal(again[rest[-1][0]], rest[-1][1])
