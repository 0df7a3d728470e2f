"""The MLX backend (issue 6) against the torch backend and transformers.

mlx[cpu] runs these on Linux: correct and slow (OpenBLAS for float32 matmuls, MLX's own CPU code
for the rest), so prompts stay short. Without mlx every test here fails with the install hint: CI installs the extra, and a
silent skip would hide a backend that never ran.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from stream_checks import parse_sse

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.http_client import running_server
from qwen_serve.conformance.implementations import Implementation
from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.errors import PluginUnavailable
from qwen_serve.registry import load_registry

CACHES = ["paged", "naive"]
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.9, max_tokens=24, ignore_eos=True)
LONG_TEXT = " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} lantern hangs above door {i * 7}."
                     for i in range(30))


@pytest.fixture(scope="module", autouse=True)
def require_mlx():
    if importlib.util.find_spec("mlx") is None:
        pytest.fail("mlx is not installed; the MLX backend tests need it: pip install -e '.[mlx]' "
                    "(mlx[cpu] on Linux)", pytrace=False)


# --- SmolLM2 (real weights, Llama architecture, GGUF) ---------------------------------------
SMOLLM2_CHUNK = 32  # the long prompt spans several prefill chunks


@pytest.fixture(scope="module")
def smollm2_case(smollm2_path):
    """Prompts, transformers' greedy tokens and the torch backend's, computed once."""
    torch_llm = LLM(str(smollm2_path), chunk_size=SMOLLM2_CHUNK)
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You are a terse assistant."},
         {"role": "user", "content": "List three prime numbers."}],
        [{"role": "user", "content": "Summarize:\n" + LONG_TEXT[:160]}],
    ]
    prompts = [torch_llm.tokenizer.encode_chat(c) for c in chats]
    assert max(len(p) for p in prompts) > 2 * SMOLLM2_CHUNK
    params = SamplingParams(max_tokens=16)
    eos = torch_llm.config.eos_token_ids
    expected = [hf_greedy(smollm2_path, p, params.max_tokens, eos) for p in prompts]
    torch_tokens = [o.token_ids for o in torch_llm.generate(prompts, params)]
    return prompts, params, expected, torch_tokens


@pytest.mark.parametrize("kv_cache", CACHES)
def test_smollm2_greedy_equals_torch_and_transformers(smollm2_path, smollm2_case, kv_cache):
    prompts, params, expected, torch_tokens = smollm2_case
    llm = LLM(backend="mlx", kv_cache=kv_cache, chunk_size=SMOLLM2_CHUNK)  # the embedded default model
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected == torch_tokens
    assert "Paris" in outs[0].text


# --- random Qwen3 (q/k norms, GQA, tied embeddings, safetensors) ----------------------------
def qwen3_prompts(llm: LLM) -> list[list[int]]:
    return [
        llm.tokenizer.encode("Hello, world!"),
        llm.tokenizer.encode_chat([{"role": "user", "content": "hi there"}]),
        llm.tokenizer.encode(LONG_TEXT[:700]),  # several chunks of 64
        [9707],  # a one-token prompt decodes from its first step
    ]


@pytest.mark.parametrize("kv_cache", CACHES)
def test_random_qwen3_greedy_equals_torch_and_transformers(qwen3_tiny, kv_cache):
    llm = LLM(str(qwen3_tiny), backend="mlx", kv_cache=kv_cache, chunk_size=64)
    prompts = qwen3_prompts(llm)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    batched = [o.token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]  # paged: prefix-cache hits
    torch_tokens = [o.token_ids for o in LLM(str(qwen3_tiny), kv_cache=kv_cache, chunk_size=64).generate(prompts, params)]
    expected = [hf_greedy(qwen3_tiny, p, params.max_tokens) for p in prompts]
    assert batched == alone == torch_tokens == expected
    assert len(set(batched[0])) > 4, "random model should produce varied tokens"
    if kv_cache == "paged":
        assert llm.parts.cache.usage().prefix_hit_blocks > 0


def test_bfloat16_safetensors_load_exactly(tmp_path):
    """Real Qwen3 checkpoints are bfloat16, which safetensors cannot hand to MLX through numpy."""
    path = make_qwen3_checkpoint(tmp_path / "bf16", Qwen3Geometry(), seed=5, dtype="bfloat16")
    llm = LLM(str(path), backend="mlx")
    prompt = llm.tokenizer.encode(LONG_TEXT[:200])
    out = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(path, prompt, 12)


# --- sampling ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_mlx(qwen3_tiny) -> LLM:
    return LLM(str(qwen3_tiny), backend="mlx")


def test_seeded_sampling_is_reproducible_and_seeds_differ(tiny_mlx):
    prompt = tiny_mlx.tokenizer.encode_chat([{"role": "user", "content": "Tell me a story."}])
    runs = [tiny_mlx.generate([prompt], SamplingParams(seed=s, **SAMPLED))[0].token_ids for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in (runs[0], runs[2], runs[3])}) == 3
    others = [tiny_mlx.tokenizer.encode(t) for t in ("Once upon a time", "The weather", LONG_TEXT[:150])]
    batch = tiny_mlx.generate([prompt] + others, SamplingParams(seed=1, **SAMPLED))
    assert batch[0].token_ids == runs[0], "a seeded request must not depend on its batch neighbours"


def test_sampling_that_leaves_one_token_draws_the_argmax(tiny_mlx):
    prompt = tiny_mlx.tokenizer.encode("Hello, world!")
    greedy = tiny_mlx.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    for settings in (dict(temperature=1.5, top_k=1), dict(temperature=1.5, top_p=1e-6), dict(temperature=1e-300)):
        params = SamplingParams(seed=4, max_tokens=12, ignore_eos=True, **settings)
        assert tiny_mlx.generate([prompt], params)[0].token_ids == greedy, settings


def test_logprobs_match_the_torch_backend(qwen3_tiny, tiny_mlx):
    prompt = tiny_mlx.tokenizer.encode_chat([{"role": "user", "content": "hi there"}])
    params = SamplingParams(max_tokens=4, logprobs=5, ignore_eos=True)
    ours = tiny_mlx.generate([prompt], params)[0]
    theirs = LLM(str(qwen3_tiny)).generate([prompt], params)[0]
    assert ours.token_ids == theirs.token_ids
    for a, b in zip(ours.logprobs, theirs.logprobs):
        assert list(a) == list(b)  # the chosen token first, then the top 5 by probability
        assert np.allclose(list(a.values()), list(b.values()), atol=1e-4)


# --- KV storage and int4 ----------------------------------------------------------------------
def test_kv_storage_grows_in_slabs_and_moves_exact_data():
    from qwen_serve.backends.mlx.kv_storage import MLXKVStorage
    from qwen_serve.backends.mlx.mx import mx

    storage = MLXKVStorage(num_layers=2, num_kv_heads=2, head_dim=4, dtype=mx.float32,
                           block_size=4, slab_blocks=3, max_blocks=8)
    assert storage.nbytes() == 0
    storage.ensure_blocks(1)
    assert storage.capacity_blocks == 3 and storage.nbytes() == 2 * 2 * 3 * 4 * 2 * 4 * 4
    storage.ensure_blocks(7)
    assert storage.capacity_blocks == 8  # the last slab stops at the pool size
    with pytest.raises(ValueError):
        storage.ensure_blocks(9)
    keys = mx.arange(3 * 8, dtype=mx.float32).reshape(3, 2, 4)
    storage.write(1, mx.array([5, 0, 30]), keys, -keys)
    k, v = storage.read(1, mx.array([[30, 5], [0, 0]]))
    assert k.shape == (2, 2, 2, 4)
    assert np.array_equal(np.array(k[0, 0]), np.array(keys[2])) and np.array_equal(np.array(v[1, 1]), -np.array(keys[1]))
    storage.copy_block(src=1, dst=6)  # slot 5 is offset 1 of block 1
    k, _ = storage.read(1, mx.array([25]))
    assert np.array_equal(np.array(k[0]), np.array(keys[0]))
    assert not np.array(storage.read(0, mx.array([25]))[0]).any()  # layer 0 was never written


def test_int4_linear_is_the_canonical_format_through_mlx_kernels():
    from qwen_serve.backends.mlx.linear import QuantizedLinear
    from qwen_serve.backends.mlx.mx import mx
    from qwen_serve.quant import int4

    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    q = int4.quantize(w)
    linear = QuantizedLinear.from_canonical(q)
    reference = int4.dequantize(q)
    assert np.array_equal(np.array(linear.dequantize()), reference)
    assert np.array_equal(np.array(linear.rows(mx.array([7, 0]))), reference[[7, 0]])
    x = rng.standard_normal((3, 256)).astype(np.float32)
    assert np.allclose(np.array(linear(mx.array(x))), x @ reference.T, atol=1e-4)


def test_int4_model_follows_its_dequantized_weights(qwen3_tiny, tmp_path):
    """Greedy int4 output equals transformers running the dequantized weights: the canonical
    int4 projections (without calibration) and MLX's int8 embedding table."""
    import torch
    from safetensors.torch import load_file, save_file

    from qwen_serve.backends.mlx.mx import mx
    from qwen_serve.quant import int4

    dequantized = tmp_path / "dequantized"
    dequantized.mkdir()
    for f in qwen3_tiny.iterdir():
        if f.suffix != ".safetensors":
            (dequantized / f.name).write_bytes(f.read_bytes())
    weights = load_file(qwen3_tiny / "model.safetensors")
    for name, w in weights.items():
        if name.endswith("_proj.weight"):
            weights[name] = torch.from_numpy(int4.dequantize(int4.quantize(w.float().numpy())))
        elif name == "model.embed_tokens.weight":
            table = mx.quantize(mx.array(w.float().numpy()), group_size=64, bits=8)
            weights[name] = torch.from_numpy(np.array(mx.dequantize(*table, group_size=64, bits=8)))
    save_file(weights, dequantized / "model.safetensors")
    llm = LLM(str(qwen3_tiny), backend="mlx", quant="int4", calibrate=False)
    prompt = llm.tokenizer.encode(LONG_TEXT[:300])
    out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(dequantized, prompt, 16)
    assert llm.parts.executor.weight_bytes() < LLM(str(qwen3_tiny), backend="mlx").parts.executor.weight_bytes() / 3


# --- BLAS ------------------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform != "linux", reason="the OpenBLAS binding is for mlx[cpu] on Linux")
def test_float32_matmuls_run_through_openblas_and_agree_with_numpy():
    from qwen_serve.backends.mlx.blas import sgemm_calls
    from qwen_serve.backends.mlx.mx import BLAS, mx

    assert BLAS.startswith("OpenBLAS"), BLAS
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((37, 200), dtype=np.float32), rng.standard_normal((200, 61), dtype=np.float32)
    before = sgemm_calls()
    product = np.array(mx.array(a) @ mx.array(np.ascontiguousarray(b.T)).T)  # [out, in].T, as DenseLinear
    assert sgemm_calls() > before
    np.testing.assert_allclose(product, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(sys.platform != "linux", reason="the OpenBLAS binding is for mlx[cpu] on Linux")
def test_the_reference_blas_can_be_kept_and_check_3_then_expects_serial_batches():
    """QWEN_SERVE_MLX_BLAS=reference keeps mlx[cpu]'s own BLAS (a fresh process: the binding is
    made once, when mlx.core loads), and the backend then declares that batches run serially."""
    script = ("from qwen_serve.backends.mlx.backend import MLXBackend; from qwen_serve.backends.mlx.blas import "
              "sgemm_calls; print(MLXBackend.blas, '|', MLXBackend.serial_compute is not None, '|', sgemm_calls())")
    kept = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "QWEN_SERVE_MLX_BLAS": "reference"})
    assert kept.stdout.split(" | ") == ["reference BLAS (bundled with mlx[cpu])", "True", "None\n"]
    bound = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "QWEN_SERVE_MLX_BLAS"})
    blas, serial, calls = bound.stdout.split(" | ")
    assert blas.startswith("OpenBLAS") and serial == "False" and calls == "0\n"


# --- plugin and server ------------------------------------------------------------------------
def test_engine_thread_may_differ_from_the_loading_thread(qwen3_tiny):
    """The server loads on the main thread and steps on its own; MLX evaluates lazy arrays
    only on the thread that recorded them, so nothing may stay lazy after loading."""
    llm = LLM(str(qwen3_tiny), backend="mlx")
    prompt = llm.tokenizer.encode("Hello, world!")
    results = []
    worker = threading.Thread(target=lambda: results.append(
        llm.generate([prompt], SamplingParams(seed=3, **SAMPLED))[0].token_ids))
    worker.start()
    worker.join()
    assert results and results[0] == llm.generate([prompt], SamplingParams(seed=3, **SAMPLED))[0].token_ids


def test_without_mlx_choosing_it_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)  # find_spec reports it missing
    with pytest.raises(PluginUnavailable) as info:
        load_registry(env={"QWEN_SERVE_PLUGINS": ""}).backend("mlx")
    message = str(info.value)
    assert "\n" not in message and "qwen-serve[mlx]" in message and "torch" in message


def test_server_streams_a_chat_with_the_mlx_backend(smollm2_path):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    body = {"messages": messages, "stream": True, "max_tokens": 12, "temperature": 0}
    with running_server(Implementation("mlx", "paged"), str(smollm2_path)) as server:
        status, _, health = server.request("GET", "/health")
        assert status == 200 and json.loads(health)["backend"] == "mlx"
        status, headers, raw = server.chat(body, timeout=300.0)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    payloads = parse_sse(raw)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") and chunks[-1]["usage"]
    assert all(c.get("usage") is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "Paris" in text
