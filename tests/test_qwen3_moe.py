"""Qwen3-MoE (Qwen3MoeForCausalLM) on both backends: greedy output equals transformers token for
token on tiny random checkpoints transformers wrote, across routings (top-1 and top-8, renormalized
or not, dense layers among sparse ones), caches, chunked prefill and mixed-length batches; the
grouped expert run equals a per-token sum; and a broken checkpoint fails at load, naming the
tensor or the config field."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.mlx import decoder_layer as mlx_layer
from qwen_serve.backends.mlx.mx import mx
from qwen_serve.backends.torch_cpu import decoder_layer as torch_layer
from qwen_serve.conformance.models import MoeRouting, Qwen3Geometry, make_qwen3_moe_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.errors import ModelLoadError
from qwen_serve.models.layers import DenseMLP, SparseMoE

ROUTINGS = {
    "top-1 of 4, a dense first layer": (MoeRouting(num_experts=4, num_experts_per_tok=1, norm_topk_prob=False,
                                                   mlp_only_layers=(0,)), Qwen3Geometry()),
    "top-8 of 16, renormalized": (MoeRouting(num_experts=16, num_experts_per_tok=8), Qwen3Geometry()),
    "every other layer sparse, top-2 of 8": (MoeRouting(norm_topk_prob=False, decoder_sparse_step=2),
                                             Qwen3Geometry(num_hidden_layers=3)),
}
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=sorted(ROUTINGS))
def moe_checkpoint(request, tmp_path_factory):
    routing, geometry = ROUTINGS[request.param]
    return make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("qwen3-moe"), routing, geometry, seed=3)


@lru_cache(maxsize=None)
def reference(path, prompt: tuple[int, ...]) -> list[int]:
    return hf_greedy(path, list(prompt), NEW_TOKENS)


def test_the_description_follows_config_json(moe_checkpoint):
    cfg = json.loads((moe_checkpoint / "config.json").read_text())
    layers = LLM(str(moe_checkpoint)).config.layers
    step, dense = cfg["decoder_sparse_step"], set(cfg["mlp_only_layers"])
    for index, layer in enumerate(layers):
        if index in dense or (index + 1) % step:
            assert layer.mlp == DenseMLP()
        else:
            assert layer.mlp == SparseMoE(cfg["num_local_experts"], cfg["num_experts_per_tok"],
                                          cfg["moe_intermediate_size"], cfg["norm_topk_prob"])


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_equals_transformers(moe_checkpoint, backend, kv_cache):
    llm = LLM(str(moe_checkpoint), backend=backend, kv_cache=kv_cache, chunk_size=32)
    prompts = [llm.tokenizer.encode("The quick brown fox"),
               llm.tokenizer.encode(" ".join(f"word{i}" for i in range(30))),  # longer than a chunk of 32
               llm.tokenizer.encode("Mixture of experts")]
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference(moe_checkpoint, tuple(prompt))
    assert len(set(outs[1].token_ids)) > 3, "a random model should produce varied tokens"
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached  # only what the prefix cache keeps


# --- the grouped expert run against a per-token sum ----------------------------------------------
class Scaled:
    """A stand-in expert: x @ W, and a count of its calls (each active expert runs once)."""

    def __init__(self, weight: np.ndarray, to_backend) -> None:
        self.weight, self.calls = to_backend(weight), 0

    def __call__(self, x, ops=None):
        self.calls += 1
        return x @ self.weight


def per_token(weights: np.ndarray, x: np.ndarray, scale: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    return np.stack([sum(scale[t, j] * (x[t] @ weights[e]) for j, e in enumerate(chosen[t]))
                     for t in range(x.shape[0])])


ROUTES = {  # 6 tokens, 2 experts each, over 5 experts
    "random": lambda rng: np.stack([rng.choice(5, 2, replace=False) for _ in range(6)]),
    "experts 0 and 4 idle": lambda rng: np.stack([rng.permutation([1, 2, 3])[:2] for _ in range(6)]),
    "expert 2 in every token": lambda rng: np.stack([[2, rng.choice([0, 1, 3, 4])] for _ in range(6)]),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_grouped_experts_equal_a_per_token_sum(route, backend):
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((5, 16, 16)).astype(np.float32)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    chosen = ROUTES[route](rng)
    scale = rng.uniform(0.1, 1.0, chosen.shape).astype(np.float32)
    if backend == "torch":
        experts = [Scaled(w, torch.from_numpy) for w in weights]
        got = torch_layer.run_experts_grouped(experts, torch.from_numpy(x), torch.from_numpy(scale),
                                              torch.from_numpy(chosen), ops=None).numpy()
    else:
        experts = [Scaled(w, mx.array) for w in weights]
        got = np.array(mlx_layer.run_experts_grouped(experts, mx.array(x), mx.array(scale), chosen))
    np.testing.assert_allclose(got, per_token(weights, x, scale, chosen), rtol=1e-5, atol=1e-5)
    assert [e.calls for e in experts] == [int((chosen == e).any()) for e in range(5)]


# --- broken checkpoints fail at load -------------------------------------------------------------
@pytest.fixture(scope="module")
def small_moe(tmp_path_factory):
    return make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("qwen3-moe-small"), MoeRouting(num_experts=4), seed=5)


def broken_copy(source, target, drop: str | None = None, **config_changes):
    target.mkdir()
    for f in source.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    if drop:
        tensors = load_file(source / "model.safetensors")
        del tensors[drop]
        save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, **config_changes}))
    return target


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_missing_expert_is_named_at_load(small_moe, tmp_path, backend):
    missing = "model.layers.1.mlp.experts.3.up_proj.weight"
    with pytest.raises(ModelLoadError, match=f"lacks tensor '{missing}'"):
        LLM(str(broken_copy(small_moe, tmp_path / "m", drop=missing)), backend=backend)


@pytest.mark.parametrize("changes, message", [
    (dict(moe_intermediate_size=32), r"tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape \[64, 64\]; config.json says \[32, 64\]"),
    (dict(num_local_experts=5), r"tensor 'model.layers.0.mlp.gate.weight' has shape \[4, 64\]; config.json says \[5, 64\]"),
    (dict(num_local_experts=3), r"tensor 'model.layers.0.mlp.gate.weight' has shape \[4, 64\]; config.json says \[3, 64\]"),
    (dict(num_experts_per_tok=5), r"num_experts_per_tok is 5; it must be 1 to num_experts \(4\)"),
])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_config_that_disagrees_with_the_weights_is_named_at_load(small_moe, tmp_path, backend, changes, message):
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(broken_copy(small_moe, tmp_path / "m", **changes)), backend=backend)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_int4_quantizes_the_experts_and_keeps_the_router_float(small_moe, backend):
    llm = LLM(str(small_moe), backend=backend, quant="int4")
    moe = llm.parts.executor.layers[0].mlp
    experts = [linear for expert in moe.experts for linear in expert.linears()]
    assert all("Int4" in type(linear).__name__ or "Quantized" in type(linear).__name__ for linear in experts)
    assert len(experts) == (4 * 2 if backend == "torch" else 4 * 3)  # torch merges gate and up
    assert "float32" in str(moe.router.dtype)  # torch: a float32 linear layer beside the experts
    out = llm.generate([llm.tokenizer.encode("The quick brown fox")], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_start_up_plan_says_what_a_token_reads(small_moe, backend):
    from qwen_serve.server.memory_plan import format_memory_plan

    llm = LLM(str(small_moe), backend=backend)
    executor = llm.parts.executor
    experts = sum(linear.nbytes() for layer in executor.layers for expert in layer.mlp.experts
                  for linear in expert.linears())
    assert executor.active_weight_bytes() == executor.weight_bytes() - experts * (4 - 2) // 4  # 2 of 4 experts skipped
    line = next(x for x in format_memory_plan(llm.parts, "float32", "none").splitlines() if x.startswith("weights"))
    assert f"{executor.active_weight_bytes() / 2**20:,.1f} MiB read per decoded token" in line


def test_int4_skips_calibration_when_the_float_model_would_not_fit(small_moe, monkeypatch):
    """Calibration loads the float model first: for Qwen3-30B-A3B that is 122 GB of float32."""
    from qwen_serve.engine import builder
    from qwen_serve.server.memory_plan import format_memory_plan

    config = LLM(str(small_moe)).config
    needed = config.parameters() * 4
    monkeypatch.setattr(builder, "available_bytes", lambda: needed)  # 80% of it is not enough
    loaded = []
    monkeypatch.setattr(builder, "measure_importance", lambda *args, **kwargs: loaded.append(args))
    llm = LLM(str(small_moe), quant="int4")
    assert loaded == [] and llm.parts.calibration.startswith("skipped: the float32 model")
    assert "int4 calibration skipped" in format_memory_plan(llm.parts, "float32", "int4")
    monkeypatch.setattr(builder, "available_bytes", lambda: 2 * needed)
    assert LLM(str(small_moe), quant="int4").parts.calibration == "skipped: no calibration text fits, or the " \
        "backend cannot watch its projections"  # measure_importance ran (and, stubbed, returned None)
    assert len(loaded) == 1


def test_the_parameter_count_is_the_checkpoints(small_moe):
    tensors = load_file(small_moe / "model.safetensors")
    counted = sum(t.numel() for name, t in tensors.items() if "norm" not in name)
    assert LLM(str(small_moe)).config.parameters() == counted


# --- the int4 experts in one C++ call ------------------------------------------------------------
FUSED_ROUTES = {  # over 4 experts, 2 each
    "random": lambda rng, T: np.stack([rng.choice(4, 2, replace=False) for _ in range(T)]),
    "experts 0 and 3 idle": lambda rng, T: np.stack([rng.permutation([1, 2]) for _ in range(T)]),
    "expert 2 in every token": lambda rng, T: np.stack([[2, rng.choice([0, 1, 3])] for _ in range(T)]),
}


@pytest.fixture(scope="module")
def int4_moe(small_moe):
    """The first layer's experts of the small checkpoint in int4 on torch, and the layer ops."""
    executor = LLM(str(small_moe), quant="int4").parts.executor
    if executor.layers[0].mlp.fused is None:
        pytest.skip("the fused expert kernel needs AVX-512 VNNI")
    return executor.layers[0].mlp, executor.ops


@pytest.mark.parametrize("tokens", [1, 5, 21])  # 21: an expert's rows span three tiles of 8
@pytest.mark.parametrize("route", sorted(FUSED_ROUTES))
def test_the_fused_int4_experts_equal_the_per_expert_run(int4_moe, route, tokens):
    moe, ops = int4_moe
    rng = np.random.default_rng(tokens)
    x = torch.from_numpy(rng.standard_normal((tokens, moe.router.in_features)).astype(np.float32))
    chosen = torch.from_numpy(FUSED_ROUTES[route](rng, tokens))
    weights = torch.from_numpy(rng.uniform(0.1, 1.0, chosen.shape).astype(np.float32))
    got = moe.fused(x, weights, chosen)
    grouped = torch_layer.run_experts_grouped(moe.experts, x, weights, chosen, ops)
    torch.testing.assert_close(got, grouped, rtol=1e-5, atol=1e-5)  # the same kernels, summed in another order
    dense = [(expert.gate_up.linear.dequantize(), expert.down_proj.dequantize()) for expert in moe.experts]
    float_sum = per_token_swiglu(dense, x, weights, chosen)
    assert float((got - float_sum).norm() / float_sum.norm()) < 0.02  # int8 activations' rounding only


def per_token_swiglu(dense, x, weights, chosen):
    rows = []
    for t in range(x.shape[0]):
        total = torch.zeros(x.shape[1])
        for j, e in enumerate(chosen[t].tolist()):
            gate, up = (x[t] @ dense[e][0].T).chunk(2)
            total += weights[t, j] * ((torch.nn.functional.silu(gate) * up) @ dense[e][1].T)
        rows.append(total)
    return torch.stack(rows)


def test_the_fused_experts_refuse_an_expert_out_of_range(int4_moe):
    moe, _ = int4_moe
    x = torch.zeros(1, moe.router.in_features)
    with pytest.raises(RuntimeError, match="expert 4 is not one of the 4"):
        moe.fused(x, torch.ones(1, 2), torch.tensor([[0, 4]]))
