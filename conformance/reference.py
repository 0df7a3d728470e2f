"""transformers as the correctness reference: greedy decoding with its own forward and cache."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=2)
def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if path.is_file():  # GGUF: transformers dequantizes it to float32 itself
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: Path, prompt_ids: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = ()) -> list[int]:
    """argmax decoding with transformers' KV cache; stops after an id in eos_ids (kept)."""
    model = hf_model(path)
    out: list[int] = []
    past = None
    inputs = torch.tensor([prompt_ids])
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            result = model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(torch.argmax(result.logits[0, -1]))
            out.append(token)
            if token in eos_ids:
                break
            inputs = torch.tensor([[token]])
    return out


def int8_rows_on_grid(weight):
    """A float table [rows, width] rounded as int8 rows with one scale per row (symmetric)."""
    import numpy as np

    step = np.abs(weight).max(axis=1, keepdims=True) / np.float32(127)  # 0 for an all-zero padding row
    return np.rint(np.divide(weight, step, out=np.zeros_like(weight), where=step > 0)) * step


def int6_rows_on_grid(weight):
    """A float table [rows, width] rounded as int6 rows: codes -31..31 times a float16 scale per
    row and group of 64 inputs (the torch backend's Int6Linear)."""
    import numpy as np

    groups = weight.reshape(weight.shape[0], -1, 64)
    step = (np.abs(groups).max(axis=2, keepdims=True) / np.float32(31)).astype(np.float16).astype(np.float32)
    codes = np.clip(np.rint(np.divide(groups, step, out=np.zeros_like(groups), where=step > 0)), -31, 31)
    return (codes * step).reshape(weight.shape)


TABLE_GRIDS = {"int8": int8_rows_on_grid, "int6": int6_rows_on_grid, "none": lambda weight: weight}


def table_kind(llm) -> str:
    """How `llm` (a qwen_serve.LLM on the torch backend) holds its embedding table: "int6",
    "int8" or "none" (float)."""
    return getattr(llm.parts.executor.embed, "kind", "none")


def hf_model_on_int4_grid(path: Path, table: str = "int8"):
    """transformers' model of `path` with its weights moved onto qwen-serve's int4 grid, as
    ``--quant int4`` without calibration holds them: every projection whose input width is whole
    groups of 64 (the others stay float, as there) (quant.int4 rounds each row
    on its own, so a weight transformers stores fused, such as the experts' gate_up, rounds as its
    parts would) and the embedding and an untied head as `table` rows (a key of TABLE_GRIDS, as the
    engine keeps them). A separate copy from hf_model's."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from qwen_serve.models.weights import is_projection
    from qwen_serve.quant import int4

    def on_grid(weight: np.ndarray) -> np.ndarray:
        if weight.ndim == 3:  # experts stacked: each on its own
            return np.stack([on_grid(w) for w in weight])
        return int4.dequantize(int4.quantize(weight)) if int4.can_quantize(weight.shape) else weight

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = p.detach().numpy()
            # Qwen3-Next's in_proj_qkvz: the rows of our in_proj_qkv and in_proj_z, regrouped
            if is_projection(name) or name.endswith(("experts.gate_up_proj", "experts.down_proj", ".in_proj_qkvz.weight")):
                p.copy_(torch.from_numpy(on_grid(w)))
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":  # multimodal: model.language_model.
                p.copy_(torch.from_numpy(TABLE_GRIDS[table](w)))
    return model


def assert_first_tokens_match(llm, hf, texts: tuple[str, ...], tolerance: float, tie_margin: float = 0.0) -> None:
    """Each text's first generated token and its top-5 log-probabilities from `llm` (a
    qwen_serve.LLM) against transformers' model `hf` on the same prompt: log-probabilities within
    tolerance, and the same token unless the reference's two best are within tie_margin."""
    from qwen_serve import SamplingParams

    prompts = [llm.tokenizer.encode(t) for t in texts]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, logprobs=5))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            reference = torch.log_softmax(hf(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
        first, second = reference.topk(2).values
        if first - second > tie_margin:
            assert out.token_ids[0] == int(torch.argmax(reference)), f"{prompt}: the first token differs"
        for token, logprob in out.logprobs[0].items():
            assert abs(logprob - float(reference[token])) < tolerance, f"{prompt}: token {token}'s log-probability"


def hf_mtp_drafts(path: Path, token_ids: list[int], num_draft: int, vocabulary: list[int] | None = None) -> list[int]:
    """What a multi-token-prediction head (conformance.models.add_mtp_head) guesses after
    token_ids, built from transformers' own modules: the model's final hidden state at each
    position but the last, joined with the embedding of the token after it through the head's
    norms and fc, then the head's decoder layer (transformers' class, causal attention over every
    row) and norm, scored by the model's head; each guess then extends the head's rows with its
    own output and the guess's embedding. Greedy, num_draft guesses, among the tokens of
    vocabulary only when given (a narrowed draft head)."""
    from safetensors.torch import load_file

    from .models import fused_experts

    model = hf_model(path)
    decoder = model.model.language_model if hasattr(model.model, "language_model") else model.model
    text = decoder.config
    head = {name.removeprefix("mtp."): value for name, value in load_file(str(Path(path) / "mtp.safetensors")).items()}
    full = text.layer_types.index("full_attention")
    layer = type(decoder.layers[full])(text, full).eval()
    layer.load_state_dict(fused_experts({name.removeprefix("layers.0."): value for name, value in head.items()
                                         if name.startswith("layers.0.")}))
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = type(decoder.norm)(text.hidden_size, eps=text.rms_norm_eps).eval()
        norms[name].load_state_dict({"weight": head[f"{name}.weight"]})
    tokens = torch.tensor([token_ids])
    with torch.inference_mode():
        hidden = decoder(input_ids=tokens).last_hidden_state[0, :-1]  # after the final norm
        inputs = list(token_ids[1:])
        guesses: list[int] = []
        for _ in range(num_draft):
            embedded = decoder.embed_tokens(torch.tensor([inputs]))[0]
            joined = torch.cat([norms["pre_fc_norm_embedding"](embedded), norms["pre_fc_norm_hidden"](hidden)], dim=-1)
            x = (joined @ head["fc.weight"].t())[None]
            positions = torch.arange(x.shape[1])[None]
            out = norms["norm"](layer(x, position_embeddings=decoder.rotary_emb(x, positions), position_ids=positions))[0]
            scores = model.lm_head(out[-1])
            if vocabulary is None:
                guesses.append(int(scores.argmax()))
            else:
                kept = torch.tensor(vocabulary)
                guesses.append(int(kept[scores[kept].argmax()]))
            hidden = torch.cat([hidden, out[-1:]])
            inputs.append(guesses[-1])
    return guesses
