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
