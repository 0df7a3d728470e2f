"""The KV storage dtype: the weights' in the library by default, asked for by name, or under
"auto" (the server's default) the backend's choice for this CPU, said in the start-up plan."""
from __future__ import annotations

import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.torch_cpu import native
from qwen_serve.engine.builder import choose_kv_dtype
from qwen_serve.errors import ModelLoadError
from qwen_serve.registry import load_registry
from qwen_serve.server.memory_plan import format_memory_plan

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29] * 4, [2, 4, 6, 8] * 10]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_the_library_keeps_the_weights_dtype(qwen3_tiny):
    parts = LLM(str(qwen3_tiny)).parts
    assert parts.engine_config.kv_dtype == "float32" and parts.storage.dtype == torch.float32
    assert "KV float32 (the weights' dtype)" in format_memory_plan(parts, "float32", "none")


def test_bfloat16_asked_for_is_stored_and_generates_like_float32(qwen3_tiny):
    float_llm = LLM(str(qwen3_tiny))
    exact = float_llm.generate(PROMPTS, PARAMS)
    llm = LLM(str(qwen3_tiny), kv_dtype="bfloat16")
    assert llm.parts.storage.dtype == torch.bfloat16
    assert llm.parts.storage.bytes_per_token() * 2 == float_llm.parts.storage.bytes_per_token()
    assert "KV bfloat16 (asked for)" in format_memory_plan(llm.parts, "float32", "none")
    rounded = llm.generate(PROMPTS, PARAMS)
    # keys and values rounded to bf16 move the logits a little; the first greedy tokens stay
    assert [o.token_ids[:4] for o in rounded] == [o.token_ids[:4] for o in exact]


@pytest.mark.parametrize("disabled", ["", "avx512", "avx512,avx2"])
def test_auto_on_torch_takes_bfloat16_where_the_kernels_attend_in_place(monkeypatch, disabled):
    monkeypatch.setenv(native.DISABLE_ENV, disabled)
    kernels = native.load_kernels()
    in_place = kernels is not None
    torch_backend = load_registry().backend("torch")
    chosen, why = choose_kv_dtype(torch_backend, "float32", "auto")
    assert chosen == ("bfloat16" if in_place else "float32") and why.startswith("auto"), why
    assert choose_kv_dtype(torch_backend, "bfloat16", "auto")[0] == "bfloat16"  # never wider than the weights


def test_auto_elsewhere_keeps_the_weights_dtype():
    chosen, why = choose_kv_dtype(load_registry().backend("mlx"), "float32", "auto")
    assert chosen == "float32" and "mlx" in why


def test_an_unknown_kv_dtype_is_a_clear_error(qwen3_tiny):
    with pytest.raises(ModelLoadError, match="int3"):
        LLM(str(qwen3_tiny), kv_dtype="int3")
