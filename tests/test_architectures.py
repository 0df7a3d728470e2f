"""Every architecture in qwen_serve.models, built by both backends from its description alone:
greedy output equals transformers token for token on a tiny random checkpoint that transformers
itself wrote. Qwen2 (q/k/v biases, no q/k norm) and Llama with every bias switched on exercise
the options Qwen3 leaves off."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.models import make_random_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.errors import ModelLoadError
from qwen_serve.models import ARCHITECTURES
from qwen_serve.models.layers import DecoderLayer, DenseMLP

CHECKPOINTS = {  # config.json architectures -> (model_type, extra config fields)
    "Qwen3ForCausalLM": ("qwen3", {}),
    "Qwen3MoeForCausalLM": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}),
    "Qwen2ForCausalLM": ("qwen2", {}),
    "LlamaForCausalLM": ("llama", {"attention_bias": True, "mlp_bias": True}),
}
BACKENDS = ["torch", "mlx"]
# hybrids of attention and linear attention, with their recurrent state's life to test too
TESTED_APART = {name: "test_qwen3_5.py" for name in ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
                                                     "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                                                     "Qwen3NextForCausalLM")}


def test_every_architecture_has_a_checkpoint_here():
    assert sorted([*CHECKPOINTS, *TESTED_APART]) == sorted(ARCHITECTURES)


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def random_checkpoint(request, tmp_path_factory):
    model_type, fields = CHECKPOINTS[request.param]
    return make_random_checkpoint(tmp_path_factory.mktemp(model_type), model_type, seed=1, **fields)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_equals_transformers(random_checkpoint, backend):
    llm = LLM(str(random_checkpoint), backend=backend, chunk_size=32)
    prompts = [llm.tokenizer.encode("The quick brown fox"),
               llm.tokenizer.encode(" ".join(f"word{i}" for i in range(30)))]  # > one chunk of 32
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(random_checkpoint, prompt, 16)
    assert len(set(outs[0].token_ids)) > 3, "a random model should produce varied tokens"


def test_the_description_follows_config_json(random_checkpoint):
    llm_config = LLM(str(random_checkpoint)).config
    first = llm_config.layers[0]
    expected = {"Qwen3ForCausalLM": (True, ()), "Qwen3MoeForCausalLM": (True, ()), "Qwen2ForCausalLM": (False, ("q_proj", "k_proj", "v_proj")),
                "LlamaForCausalLM": (False, ("q_proj", "k_proj", "v_proj", "o_proj"))}[llm_config.architecture]
    assert (first.mixer.qk_norm, first.mixer.biased) == expected
    assert len(llm_config.layers) == llm_config.num_layers


@dataclasses.dataclass(frozen=True)
class UnbuiltMixer:
    """A layer kind described in core that no backend implements (as gated DeltaNet was once)."""

    prefix: ClassVar[str] = "linear_attn"
    projections: ClassVar[tuple[str, ...]] = ()

    def weight_names(self) -> tuple[str, ...]:
        return ()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layer_kind_a_backend_lacks_is_refused_by_name(qwen3_tiny, backend, monkeypatch):
    qwen3 = ARCHITECTURES["Qwen3ForCausalLM"]
    unbuilt = dataclasses.replace(qwen3, decoder_layer=lambda cfg, i: DecoderLayer(UnbuiltMixer(), DenseMLP()))
    monkeypatch.setitem(ARCHITECTURES, "Qwen3ForCausalLM", unbuilt)
    with pytest.raises(ModelLoadError, match=f"the {backend} backend does not implement UnbuiltMixer layers"):
        LLM(str(qwen3_tiny), backend=backend)
