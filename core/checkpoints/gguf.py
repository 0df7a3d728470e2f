"""GGUF files (llama.cpp's format): metadata -> ModelConfig, vocab -> tokenizer, tensors
dequantized to float32 and renamed to transformers' names. A Q4_0 projection the backend will
hold in int4 comes as the canonical int4 format instead, converted from its blocks.

A mixture of experts stores each projection of all a layer's experts as one 3-D tensor; it is
given out one expert at a time, dequantized from that expert's own blocks, so no float copy of
the whole stack ever exists.

llama.cpp's converter permutes the rows of Llama Q/K projections to suit its rope layout; the
permutation is undone here so the weights match the HF checkpoint the file came from, as is what
it changes in an architecture's own tensors (Architecture.gguf_undo). A multi-token-prediction
head's layers follow the decoder's blocks (``nextn_predict_layers`` of them), its fc and norms
under ``nextn.*``.
"""
from __future__ import annotations

import mmap
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ModelLoadError
from ..models import architecture_for_gguf
from ..models.architecture import Architecture, read_model_config
from ..models.config import ModelConfig
from ..models.draft_head import PREFIX as DRAFT_PREFIX
from ..models.weights import is_projection
from ..quant.from_q4_0 import can_convert, int4_from_q4_0
from .checkpoint import Checkpoint
from .gguf_tokenizer import gguf_fields, tokenizer_from_gguf
from .tokenizer import Tokenizer

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
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
    "ffn_gate_inp": "mlp.gate",  # the router
}
EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
DRAFT_NAMES = {"nextn.eh_proj": "fc", "nextn.enorm": "pre_fc_norm_embedding", "nextn.hnorm": "pre_fc_norm_hidden",
               "nextn.shared_head_norm": "norm"}  # a draft block's own parts -> the draft head's names
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def load_gguf(path: Path) -> Checkpoint:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from exc
    fields = gguf_fields(reader)
    architecture = architecture_for_gguf(fields.get("general.architecture"))
    hf = hf_config(fields, {t.name for t in reader.tensors}, architecture)
    config = read_model_config(architecture, hf, name=path.stem)
    names = TensorNames(hf["num_hidden_layers"], {**LAYER_NAMES, **dict(architecture.gguf_layer_names)})
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
    pages = FilePages(reader.data)
    pages.release_span(0, min((t.data_offset for t in stored), default=0))  # the metadata, parsed
    del reader

    def tensors(framework: str, as_int4: Callable[[str], bool] | None, config: ModelConfig) -> Iterator[tuple[str, Any]]:
        for tensor in stored:
            if names.in_draft_head(tensor.name) and not config.draft_layers:
                continue  # read only to draft with
            if tensor.name.split(".")[-2] in EXPERT_NAMES:
                for name, weight in expert_tensors(tensor, names, as_int4, pages):
                    yield from architecture.tensors(name, weight, config)
                continue
            name = names.hf(tensor.name)
            permuted = architecture.gguf_rope_permuted and name.endswith(("q_proj.weight", "k_proj.weight"))
            undo = architecture.gguf_undo(name, hf)
            weight = read_weight(tensor.data, tensor.tensor_type, stored_shape(tensor), name,
                                 None if permuted or undo else as_int4, pages)
            if permuted:
                heads = config.num_heads if "q_proj" in name else config.num_kv_heads
                weight = unpermute_rope_rows(weight, heads)
            yield from architecture.tensors(name, weight if undo is None else undo(weight), config)

    experts = [t for t in stored if t.name.split(".")[-2] in EXPERT_NAMES]
    projections = [t for t in stored if t.name.split(".")[-2] not in EXPERT_NAMES and is_projection(names.hf(t.name))]
    int4_blocks = not architecture.gguf_rope_permuted and all(
        stored_as_q4_0(t.tensor_type, stored_shape(t)[-2:]) for t in experts + projections) and not any(
        architecture.gguf_undo(names.hf(t.name), hf) for t in projections)  # those come as float
    return Checkpoint(path=path, format="gguf", config=config, tokenizer=tokenizer, _tensors=tensors,
                      int4_blocks=int4_blocks)


def hf_config(fields: dict[str, Any], tensor_names: set[str], architecture: Architecture) -> dict[str, Any]:
    """GGUF metadata under config.json's keys, so one reader per architecture serves both formats."""
    arch = fields["general.architecture"]

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = get("embedding_length")
    heads = get("attention.head_count")
    declared_drafts = fields.get(f"{arch}.nextn_predict_layers") or 0
    layers = get("block_count") - declared_drafts  # the count includes the draft layers
    # ... which a file converted without them (llama.cpp's --no-mtp) declares all the same
    drafts = declared_drafts if f"blk.{layers}.nextn.eh_proj.weight" in tensor_names else 0
    experts = fields.get(f"{arch}.expert_count") or 0
    moe = {} if not experts else {
        "num_experts": experts,
        "num_experts_per_tok": get("expert_used_count"),
        "moe_intermediate_size": get("expert_feed_forward_length"),
        # llama.cpp's converter does not write expert_weights_norm for qwen3moe and its graph
        # always renormalizes the chosen weights; a file that says false is taken at its word
        "norm_topk_prob": bool(fields.get(f"{arch}.expert_weights_norm", True)),
        "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensor_names],
    }
    config = {
        "architectures": [architecture.hf_name],
        "vocab_size": fields.get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        # a mixture of experts may have no dense MLP to size
        "intermediate_size": fields.get(f"{arch}.feed_forward_length") if experts else get("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": get("context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        **moe,
    }
    if drafts:
        config["mtp_num_hidden_layers"] = drafts
    if architecture.gguf_config is not None:
        config.update(architecture.gguf_config(lambda key: fields.get(f"{arch}.{key}"), config))
    return config


class TensorNames:
    """GGUF tensor names -> transformers': blocks past the decoder's are the draft head's layers."""

    def __init__(self, layers: int, layer_names: dict[str, str]) -> None:
        self.layers = layers
        self.layer_names = layer_names

    def hf(self, gguf_name: str) -> str:
        if gguf_name in GLOBAL_NAMES:
            return GLOBAL_NAMES[gguf_name]
        match = _BLOCK_RE.fullmatch(gguf_name)
        if match is not None:
            block, part = int(match.group(1)), match.group(2)
            stem, _, kind = part.rpartition(".")
            if part in self.layer_names:  # a whole name (no .weight)
                return f"{self.block(block)}.{self.layer_names[part]}"
            if block >= self.layers and stem in DRAFT_NAMES:
                return f"{DRAFT_PREFIX}.{DRAFT_NAMES[stem]}.{kind}"
            if stem in self.layer_names and kind in ("weight", "bias"):
                return f"{self.block(block)}.{self.layer_names[stem]}.{kind}"
        raise ModelLoadError(f"unexpected GGUF tensor {gguf_name!r}")

    def in_draft_head(self, gguf_name: str) -> bool:
        match = _BLOCK_RE.fullmatch(gguf_name)
        return match is not None and int(match.group(1)) >= self.layers

    def block(self, block: int) -> str:
        return f"model.layers.{block}" if block < self.layers else f"{DRAFT_PREFIX}.layers.{block - self.layers}"


def expert_tensors(tensor: Any, names: TensorNames, as_int4: Callable[[str], bool] | None,
                   pages: "FilePages") -> Iterator[tuple[str, Any]]:
    """`blk.{i}.ffn_{gate,up,down}_exps.weight` ([experts, rows, cols] in numpy order) as one
    transformers tensor per expert. The reader's data is already [experts, rows, bytes per row]:
    quantized rows are whole blocks, so an expert's slice is its own blocks."""
    block, part = tensor.name.split(".")[1:3]
    experts, *shape = stored_shape(tensor)
    for expert in range(experts):
        name = f"{names.block(int(block))}.mlp.experts.{expert}.{EXPERT_NAMES[part]}.weight"
        yield name, read_weight(tensor.data[expert], tensor.tensor_type, tuple(shape), name, as_int4, pages)


def read_weight(data: np.ndarray, tensor_type: Any, shape: tuple[int, ...], name: str,
                as_int4: Callable[[str], bool] | None, pages: "FilePages") -> Any:
    """One stored tensor (or an expert's slice of one) as a private copy: int4 where the backend
    wants it so and its blocks convert (quant.from_q4_0), else float32; its file pages dropped."""
    if as_int4 is not None and stored_as_q4_0(tensor_type, shape) and as_int4(name):
        weight = int4_from_q4_0(data, shape)
    else:
        weight = dequantize_data(data, tensor_type, shape)
    pages.release(data)
    return weight


class FilePages:
    """The file's memory map, whose pages a tensor read in has no more use for are dropped from
    this process (madvise MADV_DONTNEED; the page cache keeps them, and a later read faults them
    back in): else every page of the file stays resident for the server's life, counted in its
    RSS beside the converted weights (the whole file, 17 GB for Qwen3-30B-A3B in Q4_0)."""

    def __init__(self, data: np.memmap) -> None:
        self.handle = getattr(data, "_mmap", None)
        self.base = data.ctypes.data

    def release(self, view: np.ndarray) -> None:
        """view: a contiguous slice of the map."""
        self.release_span(view.ctypes.data - self.base, view.ctypes.data - self.base + view.nbytes)

    def release_span(self, start: int, stop: int) -> None:
        """Bytes [start, stop) of the file: the whole pages inside."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if self.handle is None or advice is None:
            return
        start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = stop // mmap.PAGESIZE * mmap.PAGESIZE
        if stop > start:
            self.handle.madvise(advice, start, stop - start)


def stored_shape(tensor: Any) -> tuple[int, ...]:
    """numpy order (GGUF lists dimensions innermost first)."""
    return tuple(int(d) for d in reversed(tensor.shape))


def stored_as_q4_0(tensor_type: Any, shape: tuple[int, ...]) -> bool:
    """Q4_0 blocks that quant.from_q4_0 converts to int4 (a width of whole int4 groups)."""
    from gguf import GGMLQuantizationType

    return tensor_type == GGMLQuantizationType.Q4_0 and can_convert(shape)


DEQUANTIZE_ROWS = 4096  # stored rows dequantized at a time into the float32 result


def dequantize_data(data: np.ndarray, tensor_type: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A private, writable float32 copy of ``shape``, filled DEQUANTIZE_ROWS stored rows at a
    time: the gguf package's numpy dequantization makes temporaries many times its output's size.
    Loading one layer of Qwen3-30B-A3B's geometry as int4 (Q4_0 tables of 151,936 x 2048) peaked
    at 5,713 MiB dequantized whole and 2,853 MiB in chunks (1,364 MiB after the load)."""
    from gguf.quants import dequantize as gguf_dequantize

    stored = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    out = np.empty(shape, dtype=np.float32)
    rows = out.reshape(stored.shape[0], -1)
    for start in range(0, stored.shape[0], DEQUANTIZE_ROWS):
        chunk = stored[start:start + DEQUANTIZE_ROWS]
        rows[start:start + len(chunk)] = gguf_dequantize(chunk, tensor_type).reshape(len(chunk), -1)
    return out


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's row permutation, which interleaves each head's two rope halves."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape).copy()
