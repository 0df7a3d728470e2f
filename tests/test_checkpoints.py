"""Checkpoint formats: HF directories (single or sharded safetensors, chat template in either
place) and GGUF (dequantized, Q/K permutation undone), checked against transformers."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.conformance.reference import hf_model
from qwen_serve.errors import ModelLoadError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! How are you?"}]


def test_gguf_weights_equal_transformers_dequantized_weights(smollm2_path):
    ours = dict(load_checkpoint(smollm2_path).tensors())
    ref = hf_model(smollm2_path).state_dict()
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                 "model.layers.0.self_attn.v_proj.weight", "model.layers.29.mlp.down_proj.weight",
                 "model.embed_tokens.weight", "model.norm.weight"]:
        np.testing.assert_array_equal(ours[name], ref[name].numpy(), err_msg=name)


def test_gguf_config_matches_transformers(smollm2_path):
    ours = load_checkpoint(smollm2_path).config
    ref = hf_model(smollm2_path).config
    assert (ours.num_layers, ours.hidden_size, ours.num_heads, ours.num_kv_heads, ours.vocab_size) == (
        ref.num_hidden_layers, ref.hidden_size, ref.num_attention_heads, ref.num_key_value_heads, ref.vocab_size)
    assert ours.tie_word_embeddings and ours.rope_theta == 100000.0
    assert not any(layer.mixer.qk_norm for layer in ours.layers)  # Llama: no per-head q/k norm


def test_gguf_chat_template_renders_like_transformers(smollm2_path):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    ours = load_checkpoint(smollm2_path).tokenizer
    for chat in (CHAT, CHAT[1:]):
        expected = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert ours.render_chat(chat) == expected
        assert ours.encode_chat(chat) == ref.encode(expected, add_special_tokens=False)


def test_sharded_safetensors_load_the_same_model(qwen3_tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(qwen3_tiny).save_pretrained(sharded, max_shard_size="4MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_tiny / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    a = LLM(str(qwen3_tiny)).generate(["Hello there"], params)[0].token_ids
    b = LLM(str(sharded)).generate(["Hello there"], params)[0].token_ids
    assert a == b


def test_chat_template_from_jinja_file(qwen3_tiny, tmp_path):
    copy = tmp_path / "jinja"
    shutil.copytree(qwen3_tiny, copy)
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "chat_template.jinja").write_text(cfg.pop("chat_template"))
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_checkpoint(copy).tokenizer
    assert tok.render_chat(CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi! How are you?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert tok.encode_chat(CHAT)[:3] == [151644, 8948, 198]  # <|im_start|> system \n


def test_pickle_checkpoints_are_refused(tmp_path, qwen3_tiny):
    shutil.copy(qwen3_tiny / "config.json", tmp_path / "config.json")
    shutil.copy(qwen3_tiny / "tokenizer.json", tmp_path / "tokenizer.json")
    torch.save({"x": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        list(load_checkpoint(tmp_path).tensors())


def test_unsupported_architecture_is_a_clear_error(tmp_path, qwen3_tiny):
    cfg = json.loads((qwen3_tiny / "config.json").read_text())
    cfg["architectures"] = ["MixtralForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'MixtralForCausalLM'"):
        load_checkpoint(tmp_path)
