"""GGUF files (llama.cpp's format): metadata -> ModelConfig, vocab -> tokenizer, tensors
dequantized to float32 and renamed to transformers' names.

llama.cpp's converter permutes the rows of Llama Q/K projections to suit its rope layout; the
permutation is undone here so the weights match the HF checkpoint the file came from.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import ModelLoadError
from ..models import architecture_for_gguf
from ..models.architecture import read_model_config
from .checkpoint import Checkpoint
from .gguf_tokenizer import gguf_fields, tokenizer_from_gguf
from .tokenizer import Tokenizer

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: Path) -> Checkpoint:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc
    fields = gguf_fields(reader)
    architecture = architecture_for_gguf(fields.get("general.architecture"))
    config = read_model_config(architecture, hf_config(fields, {t.name for t in reader.tensors}), name=path.stem)
    tok = tokenizer_from_gguf(fields)
    tokens = fields.get("tokenizer.ggml.tokens", [])

    def token_text(key: str) -> str | None:
        idx = fields.get(key)
        return tokens[idx] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

    tokenizer = Tokenizer(
        tok, fields.get("tokenizer.chat_template"),
        token_text("tokenizer.ggml.bos_token_id"), token_text("tokenizer.ggml.eos_token_id"),
    )

    # Only the tensors outlive this call: the reader's fields hold a numpy memmap per token and
    # merge (~150 MiB of Python objects for SmolLM2's vocabulary), and the Checkpoint lives as
    # long as the server.
    stored = reader.tensors
    del reader

    def tensors(framework: str) -> Iterator[tuple[str, Any]]:
        for tensor in stored:
            name = hf_tensor_name(tensor.name)
            array = dequantize(tensor)
            if architecture.gguf_rope_permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_heads if "q_proj" in name else config.num_kv_heads
                array = unpermute_rope_rows(array, heads)
            yield name, array

    return Checkpoint(path=path, format="gguf", config=config, tokenizer=tokenizer, _tensors=tensors)


def hf_config(fields: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """GGUF metadata under config.json's keys, so one reader per architecture serves both formats."""
    arch = fields["general.architecture"]

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = get("embedding_length")
    heads = get("attention.head_count")
    return {
        "vocab_size": fields.get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": get("context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
    }


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ModelLoadError(f"unexpected GGUF tensor {gguf_name!r}")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def dequantize(tensor: Any) -> np.ndarray:
    """Any GGUF tensor type the gguf package knows (F32, F16, Q8_0, Q4_1, ...) -> float32,
    shaped [rows, cols] in numpy order (GGUF lists dimensions innermost first)."""
    from gguf.quants import dequantize as gguf_dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    array = gguf_dequantize(tensor.data, tensor.tensor_type)
    return np.array(array.reshape(shape), dtype=np.float32)  # a private, writable copy


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's row permutation, which interleaves each head's two rope halves."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape).copy()
