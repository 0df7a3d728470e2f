"""Write an HF Qwen3 / Qwen3-MoE checkpoint directory as a GGUF file laid out as llama.cpp's
converter lays it out, so tests (and benchmarks) can load the same model from both formats.

Tensors go to the file one at a time (tensor infos first, then the data), so at most one tensor,
or one layer's stack of one projection's experts, is in memory as float. Qwen's q/k rows are
stored unpermuted, as llama.cpp's converter stores them for qwen3 and qwen3moe.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
from gguf.quants import quantize
from safetensors import safe_open

from qwen_serve.checkpoints.gguf import EXPERT_NAMES, GLOBAL_NAMES, LAYER_NAMES

F32, Q8_0, Q4_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
_FILE_TYPES = {F32: gguf.LlamaFileType.ALL_F32, Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
               Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}
GGUF_ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe"}

_TO_GGUF = {hf: gg for gg, hf in GLOBAL_NAMES.items()}
_LAYER_TO_GGUF = {hf: gg for gg, hf in LAYER_NAMES.items()}
_EXPERT_TO_GGUF = {hf: gg for gg, hf in EXPERT_NAMES.items()}
_EXPERT_RE = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight")
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def write_gguf(checkpoint: Path, out: Path, tensor_type: gguf.GGMLQuantizationType = F32) -> Path:
    """checkpoint (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) -> out.

    tensor_type (F32, Q8_0, Q4_0) applies to every matrix but the router, which llama.cpp keeps
    in float32 as its converter does; norms stay float32."""
    checkpoint = Path(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    arch = GGUF_ARCHITECTURES[config["architectures"][0]]
    writer = gguf.GGUFWriter(str(out), arch)
    add_model_fields(writer, config)
    writer.add_file_type(_FILE_TYPES[tensor_type])
    add_tokenizer_fields(writer, checkpoint, config)
    with safe_open(checkpoint / "model.safetensors", "numpy") as weights:
        plan = tensor_plan(list(weights.keys()))
        encoded: list[tuple[str, gguf.GGMLQuantizationType, Callable[[], np.ndarray]]] = []
        for name, sources in plan:
            stacked = "_exps" in name

            def read(sources=sources, stacked=stacked) -> np.ndarray:
                arrays = [weights.get_tensor(s).astype(np.float32) for s in sources]
                return np.stack(arrays) if stacked else arrays[0]

            shape = weights.get_slice(sources[0]).get_shape()
            qtype = tensor_type if len(shape) == 2 and not name.endswith("ffn_gate_inp.weight") else F32
            encoded.append((name, qtype, read))
            add_tensor_info(writer, name, (len(sources), *shape) if stacked else tuple(shape), qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, qtype, read in encoded:
            array = read()
            writer.write_tensor_data(array if qtype == F32 else quantize(array, qtype))
    writer.close()
    return Path(out)


def add_tensor_info(writer: gguf.GGUFWriter, name: str, shape: tuple[int, ...],
                    qtype: gguf.GGMLQuantizationType) -> None:
    """Declare a tensor of this numpy shape and type before the data is written."""
    if qtype == F32:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    else:
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)


def tensor_plan(hf_names: list[str]) -> list[tuple[str, list[str]]]:
    """(GGUF name, the transformers tensors it holds): one for most, every expert's for a stack."""
    plan: dict[str, list[str]] = {}
    for hf in sorted(hf_names, key=_natural):
        expert = _EXPERT_RE.fullmatch(hf)
        if expert:
            layer, _, part = expert.groups()
            plan.setdefault(f"blk.{layer}.{_EXPERT_TO_GGUF[part]}.weight", []).append(hf)
        elif hf in _TO_GGUF:
            plan[_TO_GGUF[hf]] = [hf]
        else:
            layer, part, kind = _LAYER_RE.fullmatch(hf).groups()
            plan[f"blk.{layer}.{_LAYER_TO_GGUF[part]}.{kind}"] = [hf]
    return list(plan.items())


def _natural(name: str) -> list:
    """Layer and expert numbers in numeric order (expert 10 after expert 9)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def add_model_fields(writer: gguf.GGUFWriter, config: dict) -> None:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    if config.get("intermediate_size"):
        writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads", heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta") or config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    experts = config.get("num_experts", config.get("num_local_experts"))
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_weights_norm(bool(config.get("norm_topk_prob", False)))


def add_tokenizer_fields(writer: gguf.GGUFWriter, checkpoint: Path, config: dict) -> None:
    """Qwen's byte-level BPE as llama.cpp stores it: the vocabulary padded to the model's rows
    with unused [PAD{i}] tokens, special added tokens as control, the others user-defined."""
    spec = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    vocab_size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, index in spec["model"]["vocab"].items():
        tokens[index], types[index] = text, gguf.TokenType.NORMAL
    for added in spec["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if config.get(key) is not None:
            add(config[key])
    writer.add_add_bos_token(False)
    template = json.loads((checkpoint / "tokenizer_config.json").read_text()).get("chat_template")
    if template:
        writer.add_chat_template(template)


def write_random_gguf(config: dict, tokenizer_dir: Path, out: Path, seed: int = 0, scale: float = 0.02) -> Path:
    """A Qwen3 / Qwen3-MoE GGUF of config.json's geometry with random weights drawn straight as
    Q4_0 blocks, never as float: any size (Qwen3-30B-A3B's 17 GB included) is written a tensor
    at a time in seconds per layer. Codes are uniform, each block's scale makes the weights'
    standard deviation about ``scale``; the router is random float32, the norms ones.
    tokenizer_dir holds tokenizer.json and tokenizer_config.json (the Qwen tokenizer)."""
    arch = GGUF_ARCHITECTURES[config["architectures"][0]]
    writer = gguf.GGUFWriter(str(out), arch)
    add_model_fields(writer, config)
    writer.add_file_type(_FILE_TYPES[Q4_0])
    add_tokenizer_fields(writer, Path(tokenizer_dir), config)
    plan = random_tensor_plan(config)
    for name, shape, qtype in plan:
        add_tensor_info(writer, name, shape, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    block_scale = np.float16(scale / 4.6)  # codes uniform on -8..7 have a standard deviation of ~4.6
    for name, shape, qtype in plan:
        if qtype != F32:
            blocks = rng.integers(0, 256, size=(int(np.prod(shape)) // 32, 18), dtype=np.uint8)
            blocks[:, :2] = np.frombuffer(block_scale.tobytes(), dtype=np.uint8)
            writer.write_tensor_data(blocks.reshape(gguf.quant_shape_to_byte_shape(shape, qtype)))
        elif name.endswith("norm.weight"):
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
        else:
            writer.write_tensor_data(rng.normal(0.0, scale, size=shape).astype(np.float32))
    writer.close()
    return Path(out)


def random_tensor_plan(config: dict) -> list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]:
    """(GGUF name, numpy shape, type) of every tensor of a Qwen3 / Qwen3-MoE config, in llama.cpp's order."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    experts = config.get("num_experts", config.get("num_local_experts"))
    plan = [("token_embd.weight", (vocab, hidden), Q4_0)]
    for i in range(config["num_hidden_layers"]):
        b = f"blk.{i}"
        plan += [(f"{b}.attn_norm.weight", (hidden,), F32), (f"{b}.attn_q.weight", (heads * head_dim, hidden), Q4_0),
                 (f"{b}.attn_k.weight", (kv_heads * head_dim, hidden), Q4_0),
                 (f"{b}.attn_v.weight", (kv_heads * head_dim, hidden), Q4_0),
                 (f"{b}.attn_output.weight", (hidden, heads * head_dim), Q4_0),
                 (f"{b}.attn_q_norm.weight", (head_dim,), F32), (f"{b}.attn_k_norm.weight", (head_dim,), F32),
                 (f"{b}.ffn_norm.weight", (hidden,), F32)]
        if experts:
            inner = config["moe_intermediate_size"]
            plan += [(f"{b}.ffn_gate_inp.weight", (experts, hidden), F32),
                     (f"{b}.ffn_gate_exps.weight", (experts, inner, hidden), Q4_0),
                     (f"{b}.ffn_up_exps.weight", (experts, inner, hidden), Q4_0),
                     (f"{b}.ffn_down_exps.weight", (experts, hidden, inner), Q4_0)]
        else:
            inner = config["intermediate_size"]
            plan += [(f"{b}.ffn_gate.weight", (inner, hidden), Q4_0), (f"{b}.ffn_up.weight", (inner, hidden), Q4_0),
                     (f"{b}.ffn_down.weight", (hidden, inner), Q4_0)]
    plan += [("output_norm.weight", (hidden,), F32)]
    if not config.get("tie_word_embeddings"):
        plan += [("output.weight", (vocab, hidden), Q4_0)]
    return plan
