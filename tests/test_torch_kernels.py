"""The torch backend's C++ kernels against plain torch references, in every variant this CPU can
run, and their selection by CPU features (QWEN_SERVE_DISABLE_ISA forces features off)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qwen_serve.backends.torch_cpu import kernel_choice, native
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int6Linear, Int8Linear
from qwen_serve.backends.torch_cpu.kv_storage import TorchKVStorage
from qwen_serve.backends.torch_cpu.linear import DenseLinear
from qwen_serve.backends.torch_cpu.native import Kernels, cpu_features, load_kernels
from qwen_serve.backends.torch_cpu.paged_decode import PagedDecode
from qwen_serve.backends.torch_cpu.path_plan import PathPlan
from qwen_serve.backends.torch_cpu.tiles import Scratch
from qwen_serve.quant import int4

KERNELS = load_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no C++ compiler or no AVX2: the kernels are unavailable")
needs_avx512 = pytest.mark.skipif(KERNELS is None or KERNELS.isa != "avx512", reason="this CPU lacks AVX-512")


def variants() -> dict[str, Kernels]:
    """Every kernel variant this CPU runs (an AVX-512 CPU also runs the AVX2 ones)."""
    if KERNELS is None:
        return {}
    found = {}
    if KERNELS.isa == "avx512":
        if KERNELS.vnni:
            found["avx512-vnni"] = KERNELS
        found["avx512"] = Kernels("avx512", False, KERNELS.ops)
    if {"avx2", "fma", "f16c"} <= cpu_features():
        found["avx2"] = Kernels("avx2", False, KERNELS.ops)
    return found


VARIANTS = variants()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _activations(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32))
    x[:, 7] *= 50.0  # an outlier channel
    return x


# int16 activations per group of 64 (AVX-512 without VNNI): ~1e-4 relative error even with a 50x
# outlier channel. int8 activations (the VNNI kernels; AVX2's): ~0.6% without an outlier, ~2% with.
TOLERANCE = 1e-3
INT8_TOLERANCE = 3e-2


def tolerance(kernels: Kernels | None) -> float:
    return INT8_TOLERANCE if kernels is not None and kernels.int8_activations else TOLERANCE


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("out_features", [37, 200, 256])
@pytest.mark.parametrize("in_features", [192, 640])  # 3 groups of 64; 10 (kernels that take groups 8 at a time)
def test_int4_kernel_matches_torch_at_every_decode_size(name, out_features, in_features):
    rng = np.random.default_rng(out_features)
    q = int4.quantize(rng.standard_normal((out_features, in_features)).astype(np.float32))
    reference_weight = torch.from_numpy(int4.dequantize(q))
    layer = Int4Linear(q, kernels=VARIANTS[name])  # the kernel for every row count
    assert torch.equal(layer.dequantize(), reference_weight)  # the layout keeps every code
    for rows in range(1, 17):
        x = _activations(rows, in_features, seed=rows)
        y = layer(x)
        assert _rel(y, x @ reference_weight.T) < tolerance(VARIANTS[name]), rows
        assert torch.equal(layer(x[-1:]), y[-1:])  # a row's result does not depend on the batch
    x = torch.randn(16, in_features, generator=torch.Generator().manual_seed(0))  # no outlier channel
    assert _rel(layer(x), x @ reference_weight.T) < tolerance(VARIANTS[name]) / 3


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("out_features", [37, 200])
def test_int8_kernel_matches_torch_at_every_decode_size(name, out_features):
    w = torch.randn(out_features, 128, generator=torch.Generator().manual_seed(out_features))
    layer = Int8Linear(w, kernels=VARIANTS[name])
    reference_weight = layer.dequantize()
    assert _rel(reference_weight, w) < 0.01
    ids = torch.tensor([0, out_features - 1, 5, 5])
    assert torch.equal(layer.lookup(ids), reference_weight[ids])
    for rows in (1, 2, 7, 8, 9, 13, 16):
        x = _activations(rows, 128, seed=rows)
        y = layer(x)
        assert _rel(y, x @ reference_weight.T) < tolerance(VARIANTS[name]), rows
        assert torch.equal(layer(x[-1:]), y[-1:])


@pytest.mark.skipif("avx512-vnni" not in VARIANTS, reason="the int6 kernel needs AVX-512 VNNI")
@pytest.mark.parametrize("out_features", [37, 200])
@pytest.mark.parametrize("in_features", [64, 192])
def test_int6_kernel_matches_torch_at_every_decode_size(out_features, in_features):
    w = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(out_features))
    layer = Int6Linear(w, kernels=VARIANTS["avx512-vnni"])
    reference_weight = layer.dequantize()
    assert _rel(reference_weight, w) < 0.03
    ids = torch.tensor([0, out_features - 1, 5, 5])
    assert torch.equal(layer.lookup(ids), reference_weight[ids])
    for rows in range(1, 17):
        x = _activations(rows, in_features, seed=rows)
        y = layer(x)
        assert _rel(y, x @ reference_weight.T) < INT8_TOLERANCE, rows
        assert torch.equal(layer(x[-1:]), y[-1:])
    x = torch.randn(16, in_features, generator=torch.Generator().manual_seed(0))  # no outlier channel
    assert _rel(layer(x), x @ reference_weight.T) < INT8_TOLERANCE / 3
    # Exact but for float rounding, given the activations as the kernel rounds them (int8 per group of 64)
    x = _activations(5, in_features, seed=9)
    top = x.view(5, -1, 64).abs().amax(dim=2, keepdim=True)
    rounded = (torch.round(x.view(5, -1, 64) * (127 / top)) * (top / 127)).view(5, in_features)
    assert _rel(layer(x).double(), rounded.double() @ reference_weight.double().T) < 1e-6


def bf16_variants() -> dict[str, Kernels]:
    """The bf16 kernel with vdpbf16ps where the CPU has AVX512-BF16, and widening on any AVX-512 CPU."""
    if KERNELS is None or KERNELS.isa != "avx512":
        return {}
    widened = {"widened": Kernels("avx512", KERNELS.vnni, KERNELS.ops, bf16=False)}
    return ({"avx512-bf16": Kernels("avx512", KERNELS.vnni, KERNELS.ops, bf16=True)}
            if "avx512_bf16" in cpu_features() else {}) | widened


BF16_VARIANTS = bf16_variants()


def bf16_reference(x: torch.Tensor, w: torch.Tensor, kernels: Kernels) -> torch.Tensor:
    """vdpbf16ps multiplies x rounded to bf16; the widening kernel multiplies x as it is."""
    return (x.bfloat16().float() if kernels.bf16 else x) @ w.float().T


@pytest.mark.parametrize("name", BF16_VARIANTS)
@pytest.mark.parametrize("rows", [1, 3, 8, 11, 16, 37])
@pytest.mark.parametrize("width", [96, 2048])  # 2048: panels of 3 blocks, the last one short
def test_bf16_head_kernel_gives_float32_logits(name, rows, width):
    kernels = BF16_VARIANTS[name]
    w = torch.randn(301, width, generator=torch.Generator().manual_seed(rows)).bfloat16()
    head = DenseLinear(w)
    head.as_head(kernels)
    assert head.blocked is not None and head.weight is None
    x = _activations(rows, width, seed=rows)
    y = head(x)
    assert y.dtype == torch.float32
    assert _rel(y, bf16_reference(x, w, kernels)) < 1e-5  # products summed in float32
    ids = torch.tensor([300, 0, 17])
    assert torch.equal(head.lookup(ids), w.float()[ids])


@needs_avx512
def test_bf16_layers_take_the_blocked_kernel_where_there_is_no_amx(monkeypatch):
    w = torch.randn(48, 64).bfloat16()
    bias = torch.randn(48)
    layer = DenseLinear(w, bias)
    layer.prepack(KERNELS)
    if "amx_bf16" in cpu_features():
        assert layer.blocked is None and layer.packed is not None
        return
    assert layer.blocked is not None and layer.packed is None and layer.weight is None
    x = torch.randn(2, 3, 64)  # any leading shape
    assert _rel(layer(x), bf16_reference(x, w, KERNELS) + bias) < 1e-5
    monkeypatch.setenv(native.DISABLE_ENV, "avx512_bf16")
    elsewhere = DenseLinear(w)
    elsewhere.prepack(load_kernels())
    assert elsewhere.blocked is not None and not elsewhere.kernels.bf16  # the widening kernel
    assert _rel(elsewhere(x), x @ w.float().T) < 1e-5
    monkeypatch.setenv(native.DISABLE_ENV, "avx512")
    without = DenseLinear(w)
    without.prepack(load_kernels())
    assert without.in_columns and without.kernels.isa == "avx2"  # the AVX2 kernel's column layout
    assert _rel(without(x), x @ w.float().T) < 1e-5
    monkeypatch.setenv(native.DISABLE_ENV, "avx512,avx2")
    plain = DenseLinear(w)
    plain.prepack(load_kernels())
    assert plain.blocked is None


def test_tiles_of_the_blocked_layout_match_when_rows_are_not_whole_blocks():
    q = int4.quantize(np.random.default_rng(9).standard_normal((200, 128)).astype(np.float32))
    for kernels in [v for k, v in VARIANTS.items() if k.startswith("avx512")][:1] + [None]:
        layer = Int4Linear(q, kernels=kernels, scratch=Scratch(floats=128 * 40))  # tiles of 32
        layer.plan = PathPlan.fixed("tiles_f32")
        x = _activations(40, 128, seed=3)
        assert _rel(layer(x), x @ torch.from_numpy(int4.dequantize(q)).T) < 1e-5


# --- selection by CPU features ------------------------------------------------------------------


@needs_kernels
@pytest.mark.parametrize("disabled, isa, vnni", [
    ("", None, None), ("avx512_vnni", "avx512", False), ("avx512", "avx2", False), ("avx512,avx2", None, False),
])
def test_disabling_features_selects_the_fallbacks(monkeypatch, disabled, isa, vnni):
    monkeypatch.setenv(native.DISABLE_ENV, disabled)
    chosen = load_kernels()
    if disabled == "":
        assert chosen == KERNELS
        return
    if isa == "avx512" and KERNELS.isa != "avx512":
        pytest.skip("this CPU lacks AVX-512")
    if isa is None:
        assert chosen is None
    else:
        assert chosen is not None and chosen.isa == (isa if KERNELS.isa == "avx512" else "avx2")
        assert chosen.vnni is vnni
    q = int4.quantize(np.random.default_rng(1).standard_normal((48, 128)).astype(np.float32))
    layer = Int4Linear(q)  # picks up the forced choice
    assert layer.kernels == chosen and layer.blocked == (chosen is not None and chosen.isa == "avx512")
    x = _activations(5, 128, seed=5)
    assert _rel(layer(x), x @ torch.from_numpy(int4.dequantize(q)).T) < tolerance(chosen)


def test_disabling_bf16_keeps_float32_compute(monkeypatch):
    monkeypatch.setenv(native.DISABLE_ENV, "avx512_bf16,amx")
    assert not native.has_fast_bf16_matmul()
    w = torch.randn(64, 64).bfloat16()
    layer = DenseLinear(w)
    layer.prepack()
    assert layer.dtype == torch.float32 and layer.packed is None  # upcast per call, as without bf16 units
    x = torch.randn(3, 64)
    assert _rel(layer(x), x @ w.float().T) < 1e-6


# --- paged decode attention ---------------------------------------------------------------------


def _gathered_reference(q, storage, layer, tables, lengths):
    """SDPA over each sequence's history gathered through its block table (the generic path)."""
    bs, out = storage.block_size, []
    for b, (table, n) in enumerate(zip(tables, lengths)):
        slots = (torch.tensor(table)[:, None] * bs + torch.arange(bs)).reshape(-1)[:n]
        k, v = storage.read(layer, slots)
        out.append(F.scaled_dot_product_attention(q[b:b + 1, :, None, :], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                  scale=0.125, enable_gqa=True)[0, :, 0, :])
    return torch.stack(out)


PAGED_ISAS = sorted({k.isa for k in VARIANTS.values()})


def _random_storage(kv_heads, head_dim, dtype, blocks, gen, layers=2):
    storage = TorchKVStorage(layers, kv_heads, head_dim, dtype, 16, 8, blocks)
    storage.ensure_blocks(blocks)
    for layer in range(layers):
        storage.keys[layer].copy_(torch.randn(storage.keys[layer].shape, generator=gen))
        storage.values[layer].copy_(torch.randn(storage.values[layer].shape, generator=gen))
    return storage


def _padded_tables(tables):
    padded = torch.zeros((len(tables), max(map(len, tables))), dtype=torch.long)
    for row, table in zip(padded, tables):
        row[: len(table)] = torch.tensor(table)
    return padded


@needs_kernels
@pytest.mark.parametrize("isa", PAGED_ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 2, 16), (16, 8, 128), (3, 3, 32), (9, 3, 64), (8, 2, 208), (16, 2, 64), (10, 2, 32)])
def test_paged_decode_matches_the_gathered_reference(isa, dtype, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(heads * head_dim)
    blocks = 72
    storage = _random_storage(kv_heads, head_dim, dtype, blocks, gen)
    order = torch.randperm(blocks, generator=gen).tolist()
    shared = order[:3]  # a prefix that two sequences hold by reference
    tables = [shared + order[3:5], shared + order[5:6], order[6:7], order[7:17], order[17:18], order[18:36],
              order[36:69]]
    # partial and full last blocks; the last two are cut into parts of 256 tokens that are joined
    lengths = [16 * 4 + 5, 16 * 3 + 16, 1, 16 * 9 + 11, 16, 16 * 17 + 3, 16 * 32 + 7]
    q = torch.randn(len(tables), heads, head_dim, generator=gen)
    paged = PagedDecode(storage, _padded_tables(tables), torch.tensor(lengths), Kernels(isa, False, KERNELS.ops))
    for layer in range(2):
        got = paged.attend(layer, q, 0.125)
        assert _rel(got, _gathered_reference(q, storage, layer, tables, lengths)) < 1e-5


@needs_kernels
@pytest.mark.parametrize("isa", PAGED_ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_gives_a_sequence_the_same_bits_in_any_batch(isa, dtype):
    """A long sequence is cut into parts, and a lone short one into slices of kv heads, by what the
    step holds: neither may change a sequence's result."""
    gen = torch.Generator().manual_seed(7)
    storage = _random_storage(2, 64, dtype, 80, gen, layers=1)
    order = torch.randperm(80, generator=gen).tolist()
    tables = [order[:40], order[40:42], order[42:80]]
    lengths = [16 * 39 + 9, 20, 16 * 37 + 1]
    q = torch.randn(len(tables), 8, 64, generator=gen)
    kernels = Kernels(isa, False, KERNELS.ops)
    together = PagedDecode(storage, _padded_tables(tables), torch.tensor(lengths), kernels).attend(0, q, 0.125)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        alone = PagedDecode(storage, _padded_tables([table]), torch.tensor([n]), kernels).attend(0, q[b:b + 1], 0.125)
        assert torch.equal(alone[0], together[b])


@needs_kernels
@pytest.mark.parametrize("isa", PAGED_ISAS)
def test_paged_decode_refuses_a_table_outside_the_cache(isa):
    storage = TorchKVStorage(1, 2, 16, torch.float32, 16, 4, 4)
    storage.ensure_blocks(4)
    paged = PagedDecode(storage, torch.tensor([[0, 9]]), torch.tensor([20]), Kernels(isa, False, KERNELS.ops))
    with pytest.raises(RuntimeError, match="outside the cache"):
        paged.attend(0, torch.randn(1, 4, 16), 0.25)


@needs_kernels
@pytest.mark.parametrize("isa", PAGED_ISAS)
def test_paged_decode_reads_queries_at_a_row_stride(isa):
    storage = TorchKVStorage(1, 2, 16, torch.float32, 16, 4, 4)
    storage.ensure_blocks(4)
    storage.keys[0].normal_()
    storage.values[0].normal_()
    paged = PagedDecode(storage, torch.tensor([[2, 0], [1, 3]]), torch.tensor([20, 7]), Kernels(isa, False, KERNELS.ops))
    wide = torch.randn(2, 4 * 16 + 48)  # q columns first, as in the merged q/k/v output
    q = wide[:, : 4 * 16].view(2, 4, 16)
    assert _rel(paged.attend(0, q, 0.25), paged.attend(0, q.contiguous(), 0.25)) == 0


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_write_stores_strided_rows_as_index_copy_would(dtype):
    kv_heads, head_dim, T = 2, 16, 5
    torch.manual_seed(0)
    fast = TorchKVStorage(1, kv_heads, head_dim, dtype, 16, 4, 4)
    plain = TorchKVStorage(1, kv_heads, head_dim, dtype, 16, 4, 4, kernels=None)
    for storage in (fast, plain):
        storage.ensure_blocks(4)
        storage.keys[0].zero_()
        storage.values[0].zero_()
    qkv = torch.randn(T, (4 + 2 * kv_heads) * head_dim)
    qkv[0, 4 * head_dim] = 1.0 + 2.0 ** -8  # a tie between two bfloat16 values: rounds to even
    qkv[1, 4 * head_dim] = float("nan")
    k = qkv[:, 4 * head_dim: (4 + kv_heads) * head_dim].view(T, kv_heads, head_dim)
    v = qkv[:, (4 + kv_heads) * head_dim:].view(T, kv_heads, head_dim)
    slots = torch.tensor([3, 17, 40, 0, 63])
    fast.write(0, slots, k, v)
    plain.write(0, slots, k.contiguous(), v.contiguous())
    for got, want in ((fast.keys[0], plain.keys[0]), (fast.values[0], plain.values[0])):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # exactly, NaN where torch has it
    with pytest.raises(RuntimeError, match="outside the cache"):
        fast.write(0, torch.tensor([64, 0, 0, 0, 0]), k, v)


# --- whole models: the in-place attention against the generic gather path --------------------------


@needs_kernels
@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
@pytest.mark.parametrize("dtype, quant", [("float32", "none"), ("bfloat16", "none"), ("float32", "int4")])
def test_greedy_with_in_place_attention_equals_the_gather_path(qwen3_tiny, monkeypatch, kv_cache, dtype, quant):
    from qwen_serve import LLM, SamplingParams
    from qwen_serve.backends.torch_cpu import model as model_module

    llm = LLM(str(qwen3_tiny), kv_cache=kv_cache, dtype=dtype, quant=quant, calibrate=False, chunk_size=64)
    prompts = [llm.tokenizer.encode("Hello, world!"), llm.tokenizer.encode("The quick brown fox " * 30)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    seen = []
    real_layout = model_module.paged_decode_layout
    monkeypatch.setattr(model_module, "paged_decode_layout", lambda *a: seen.append(real_layout(*a)) or seen[-1])
    in_place = [o.token_ids for o in llm.generate(prompts, params)]
    assert any(p is not None for p in seen)  # the kernel did run
    monkeypatch.setattr(model_module, "paged_decode_layout", lambda *a: None)
    gathered = [o.token_ids for o in llm.generate(prompts, params)]
    assert in_place == gathered


@needs_avx512
@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
@pytest.mark.parametrize("dtype, quant", [("float32", "int4"), ("bfloat16", "int4"), ("bfloat16", "none")])
def test_fused_decode_layers_give_the_bits_of_the_per_op_path(tmp_path_factory, monkeypatch, kv_cache, dtype, quant):
    """decode_layers_ (every layer of a decode-only step in one call; int4 or bf16 blocks) against
    the same model op by op: the same tokens and the same logprobs to the bit, at 1 and 3 rows."""
    if quant == "none" and "amx_bf16" in cpu_features():
        pytest.skip("bf16 projections run the blocked kernel only where there is no AMX")
    from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint

    geometry = Qwen3Geometry(num_hidden_layers=3, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64)  # widths the blocked int4 layout takes
    path = make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-int4-widths"), geometry, seed=3)
    _fused_equals_per_op(path, monkeypatch, kv_cache=kv_cache, dtype=dtype, quant=quant)


@needs_avx512
def test_fused_decode_layers_on_a_llama_without_qk_norm(smollm2_path, monkeypatch):
    """SmolLM2: Llama (no q/k norm), 9 heads on 3 KV heads, real weights."""
    _fused_equals_per_op(smollm2_path, monkeypatch, kv_cache="paged", dtype="float32", quant="int4")


@needs_avx512
@pytest.mark.parametrize("dtype, quant", [("float32", "int4"), ("bfloat16", "none")])
def test_fused_decode_layers_on_a_gated_deltanet_hybrid(tmp_path_factory, monkeypatch, dtype, quant):
    """Qwen3.5: Gated DeltaNet layers (their states updated in place) among gated attention
    layers with a quarter of each head turned; one sequence starts decoding from a one-token
    prompt (its state starts at zeros inside the op)."""
    if quant == "none" and "amx_bf16" in cpu_features():
        pytest.skip("bf16 projections run the blocked kernel only where there is no AMX")
    from qwen_serve.conformance.models import LinearAttentionGeometry, Qwen3Geometry, make_qwen3_5_checkpoint

    geometry = Qwen3Geometry(num_hidden_layers=4, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64)  # widths the blocked int4 layout takes
    linear = LinearAttentionGeometry(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                     linear_value_head_dim=32, full_attention_interval=2)
    path = make_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3.5-int4-widths"), geometry, linear, seed=3)
    _fused_equals_per_op(path, monkeypatch, kv_cache="paged", dtype=dtype, quant=quant, one_token_prompt=True)


@pytest.mark.skipif("avx512-vnni" not in VARIANTS, reason="the experts' kernel needs AVX-512 VNNI")
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
def test_fused_decode_layers_on_a_mixture_of_experts(tmp_path_factory, monkeypatch, family):
    """Mixture-of-experts layers inside the one call: Qwen3-MoE with a dense layer among them and
    routing weights left as the softmax gives them; Qwen3.5-MoE with Gated DeltaNet layers, its
    weights renormalized and a gated shared expert. Same tokens and logprobs to the bit."""
    from qwen_serve.conformance.models import (
        LinearAttentionGeometry,
        MoeRouting,
        Qwen3Geometry,
        make_qwen3_5_checkpoint,
        make_qwen3_moe_checkpoint,
    )

    geometry = Qwen3Geometry(num_hidden_layers=4, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64)  # widths the blocked int4 layout takes
    directory = tmp_path_factory.mktemp(family)
    if family == "qwen3_moe":
        routing = MoeRouting(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=False,
                             mlp_only_layers=(1,))
        path = make_qwen3_moe_checkpoint(directory, routing, geometry, seed=3)
    else:
        linear = LinearAttentionGeometry(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                         linear_value_head_dim=32, full_attention_interval=2)
        routing = MoeRouting(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=64)
        path = make_qwen3_5_checkpoint(directory, geometry, linear, seed=3, family="moe", routing=routing,
                                       shared_expert_size=128)
    _fused_equals_per_op(path, monkeypatch, kv_cache="paged", dtype="float32", quant="int4")


@needs_avx512
def test_fused_decode_layers_verify_drafts_on_a_gated_deltanet_hybrid(tmp_path_factory, monkeypatch):
    """Steps whose chunks carry drafts (the checkpoint's MTP head's) take the fused call too: each
    chunk's Gated DeltaNet state steps row by row inside the op, keeping the states a rewind
    returns to, so rejected drafts roll back as on the per-op path (the same tokens, the same
    drafts kept; requests asking for logprobs are not drafted for)."""
    from qwen_serve.conformance.models import (
        LinearAttentionGeometry,
        Qwen3Geometry,
        add_mtp_head,
        make_qwen3_5_checkpoint,
    )

    geometry = Qwen3Geometry(num_hidden_layers=4, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64)
    linear = LinearAttentionGeometry(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                     linear_value_head_dim=32, full_attention_interval=2)
    path = add_mtp_head(make_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3.5-int4-drafts"), geometry, linear,
                                                seed=3), seed=3)
    _fused_equals_per_op(path, monkeypatch, kv_cache="paged", dtype="float32", quant="int4", drafts=True,
                         speculative="mtp", num_speculative_tokens=3)


@needs_avx512
def test_the_fused_decode_keeps_the_snapshots_a_next_turn_resumes_from(tmp_path_factory, monkeypatch):
    """Decoding past a block end leaves a prefix-cache snapshot of the state there; inside the
    fused op as on the per-op path: a next turn sending the reply back resumes at its last block
    end and goes on as the per-op model does (a state never written there would not)."""
    from qwen_serve import LLM, SamplingParams
    from qwen_serve.backends.torch_cpu.fused_decode import FusedDecode
    from qwen_serve.conformance.models import LinearAttentionGeometry, Qwen3Geometry, make_qwen3_5_checkpoint

    monkeypatch.setenv(kernel_choice.ENV, "int4=kernel")
    geometry = Qwen3Geometry(num_hidden_layers=4, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64)  # widths the blocked int4 layout takes
    linear = LinearAttentionGeometry(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                                     linear_value_head_dim=32, full_attention_interval=2)
    path = make_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3.5-next-turn"), geometry, linear, seed=3)
    fused_calls = []
    real_call = FusedDecode.__call__
    monkeypatch.setattr(FusedDecode, "__call__", lambda self, *args: fused_calls.append(1) or real_call(self, *args))
    results = []
    for fused in (True, False):
        llm = LLM(str(path), quant="int4", calibrate=False, chunk_size=32)
        if not fused:
            llm.parts.executor.fused = None
        first = llm.tokenizer.encode("The quick brown fox")
        params = SamplingParams(max_tokens=40, ignore_eos=True)
        reply = llm.generate([first], params)[0].token_ids
        before = llm.parts.cache.state_hit_tokens
        follow = first + reply + llm.tokenizer.encode(" and then")
        results.append((reply, llm.generate([follow], params)[0].token_ids, llm.parts.cache.state_hit_tokens - before))
        if fused:
            assert fused_calls, "the fused op never ran"
    block = llm.parts.cache.block_size
    assert results[0] == results[1] and results[0][2] == (len(first) + 39) // block * block > 0


def _fused_equals_per_op(path, monkeypatch, one_token_prompt: bool = False, drafts: bool = False,
                         **options) -> None:
    from qwen_serve import LLM, SamplingParams
    from qwen_serve.backends.torch_cpu.fused_decode import FusedDecode

    # the fused op runs the int4 and bf16 kernels on their blocked layouts: on widths this small
    # the timed choice may give tiles even single rows (microseconds apart either way), or bf16
    # oneDNN's layout on a CPU with AMX
    monkeypatch.setenv(kernel_choice.ENV, "int4=kernel,bf16=kernel")
    fused_llm, per_op_llm = (LLM(str(path), calibrate=False, chunk_size=64, **options)
                             for _ in range(2))  # fresh caches: the same prefix hits
    fused_model, per_op_model = fused_llm.parts.executor, per_op_llm.parts.executor
    assert fused_model.fused is not None
    per_op_model.fused = None
    # checkpoints from transformers have every norm weight at 1: random ones (the same in both
    # models, set in place, so the fused op's weight list sees them) make a swapped norm show
    generator = torch.Generator().manual_seed(5)
    for a, b in zip(_norms(fused_model), _norms(per_op_model)):
        values = 1 + 0.5 * torch.randn(a.shape, generator=generator)
        a.copy_(values)
        b.copy_(values)
    rows, drafted = [], []
    real_call = FusedDecode.__call__

    def recorded(self, hidden, x, cos, sin, step, *rest):
        rows.append(hidden.shape[0])
        drafted.append(step.states is not None and not step.states.decoding)
        return real_call(self, hidden, x, cos, sin, step, *rest)

    monkeypatch.setattr(FusedDecode, "__call__", recorded)
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=None if drafts else 5)  # logprobs: no drafts
    encode = fused_llm.tokenizer.encode
    prompt_sets = ([encode("Hello, world!")], [encode(t) for t in ("The quick brown fox " * 20, "One two", "Lorem ipsum")])
    if one_token_prompt:
        prompt_sets += ([encode("Hello")[:1], encode("Lorem ipsum")],)

    def run(llm) -> list:
        return [[(o.token_ids, o.logprobs) for o in llm.generate(prompts, params)] for prompts in prompt_sets]

    storages = [llm.parts.cache.state_storage for llm in (fused_llm, per_op_llm)] if drafts else []
    for storage in storages:  # reserved uninitialized: slots neither model writes must compare equal too
        for tensor in (*storage.conv_history, *storage.recurrent):
            tensor.zero_()
    fused = run(fused_llm)
    if drafts:  # steps verifying drafts took the fused call, and the first sequence's went ahead of its drafts
        assert any(drafted) and 1 + options["num_speculative_tokens"] in rows
    else:  # single-stream and batched decode steps took the fused call
        assert 1 in rows and 3 in rows and not any(drafted)
    calls = len(rows)
    assert run(per_op_llm) == fused and len(rows) == calls
    if drafts:
        stats = fused_llm.engine.stats, per_op_llm.engine.stats
        assert stats[0].draft_tokens_total == stats[1].draft_tokens_total > 0
        assert stats[0].accepted_draft_tokens_total == stats[1].accepted_draft_tokens_total < stats[0].draft_tokens_total
        # every state slot alike, the kept states a rewind returns to among them (the op steps a
        # drafted chunk's rows from one kept state into the next, the per-op path in place and copies)
        for kept in ("recurrent", "conv_history"):
            for a, b in zip(getattr(storages[0], kept), getattr(storages[1], kept)):
                assert torch.equal(a, b)
        # the op updates one step's states in parallel: a plan whose rows in one step share a state
        # slot is refused, not raced
        from qwen_serve.backends.torch_cpu import fused_decode

        real_order = fused_decode.stepping_order

        def one_slot(layout):
            slots, fresh, order = real_order(layout)
            return slots.fill_(int(slots[0])), fresh, order

        monkeypatch.setattr(fused_decode, "stepping_order", one_slot)
        with pytest.raises(RuntimeError, match="share a state slot"):
            fused_llm.generate(prompt_sets[1], params)


def _norms(model) -> list[torch.Tensor]:
    mixers = [getattr(layer.mixer, name, None) for layer in model.layers for name in ("q_norm", "k_norm", "out_norm")]
    layers = [t for layer in model.layers for t in (layer.input_norm, layer.post_norm)] + mixers
    return [t for t in layers if t is not None] + [model.norm]


def test_a_build_killed_midway_does_not_block_the_next_one(tmp_path):
    # torch's lock file, left by a build that was killed, would make every later load wait forever.
    (tmp_path / "lock").touch()
    with native._build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 37])
def test_fused_layer_steps_match_their_torch_form(rows):
    from qwen_serve.backends.torch_cpu.layer_ops import LayerOps

    torch.manual_seed(rows)
    fused, plain = LayerOps(KERNELS), LayerOps(None)
    hidden, delta, weight = torch.randn(rows, 96), torch.randn(rows, 96), torch.rand(96) + 0.5
    torch.testing.assert_close(fused.rms_norm(hidden, weight, 1e-6), plain.rms_norm(hidden, weight, 1e-6))
    expected_hidden, expected_norm = plain.add_rms_norm(hidden, delta, weight, 1e-6)
    summed, normed = fused.add_rms_norm(hidden.clone(), delta, weight, 1e-6)
    torch.testing.assert_close(summed, expected_hidden)
    torch.testing.assert_close(normed, expected_norm)
    for rotary in (32, 8):  # every dimension of a head, or its first quarter (Qwen3.5)
        angles = torch.rand(rows, rotary) * 40
        _check_head_norm_rope(fused, plain, rows, angles.cos(), angles.sin())
    gate, up = torch.randn(rows, 200) * 4, torch.randn(rows, 200)
    torch.testing.assert_close(fused.silu_mul(gate, up), plain.silu_mul(gate, up))
    for width in (200, 3000):  # 3000: the threads split rows midway
        gate_up = torch.randn(rows, 2 * width) * 4  # the halves of a merged gate/up output
        gate, up = gate_up[:, :width], gate_up[:, width:]
        torch.testing.assert_close(fused.ops.silu_mul(gate, up), F.silu(gate) * up)  # the kernel itself
        attended = torch.randn(rows, width)  # gated attention: its output times sigmoid(the gate's columns)
        torch.testing.assert_close(fused.sigmoid_mul(attended.clone(), gate), attended * torch.sigmoid(gate))
    with pytest.raises(RuntimeError, match="alike"):
        fused.ops.sigmoid_mul_(torch.randn(rows, 8), torch.randn(rows, 9))
    for experts, top_k in ((8, 2), (128, 8)):  # a mixture's routing: the experts chosen, their weights
        logits = torch.randn(rows, experts) * 3
        for normalize in (False, True):
            weights, chosen = fused.route_top_k(logits, top_k, normalize)
            expected_weights, expected_chosen = plain.route_top_k(logits, top_k, normalize)
            assert torch.equal(chosen, expected_chosen)
            torch.testing.assert_close(weights, expected_weights)
    tied = torch.zeros(rows, 8)  # equal probabilities: the lower index first, as a stable sort
    assert fused.route_top_k(tied, 3, True)[1].tolist() == [[0, 1, 2]] * rows
    with pytest.raises(RuntimeError, match="top_k"):
        fused.route_top_k(tied, 9, True)
    out, shared, shared_gate = torch.randn(rows, 96), torch.randn(rows, 96), torch.randn(rows, 1) * 3
    expected = plain.add_sigmoid_gated(out, shared, shared_gate)
    torch.testing.assert_close(fused.add_sigmoid_gated(out.clone(), shared, shared_gate), expected)
    overlapping = torch.randn(1, 4, 32).expand(max(rows, 2), 4, 32)  # rows sharing memory: refused
    cos, sin = torch.ones(len(overlapping), 32), torch.zeros(len(overlapping), 32)
    with pytest.raises(RuntimeError, match="overlap"):
        fused.ops.head_norm_rope_(overlapping, None, 1e-6, cos, sin)
    with pytest.raises(RuntimeError, match="rotary width"):  # wider than a head
        fused.ops.head_norm_rope_(torch.randn(2, 4, 32), None, 1e-6, torch.ones(2, 34), torch.zeros(2, 34))


def _check_head_norm_rope(fused, plain, rows: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The kernel against the torch form, heads of 32 with cos and sin as wide as the rotation."""
    for head_weight in (torch.rand(32) + 0.5, None):
        x = torch.randn(rows, 4, 32)
        expected = plain.head_norm_rope(x.clone(), head_weight, 1e-6, cos, sin)
        torch.testing.assert_close(fused.head_norm_rope(x, head_weight, 1e-6, cos, sin), expected)
        # The k columns of a merged q/k/v output: rows at a stride, the other columns untouched.
        merged = torch.randn(rows, 7 * 32)
        before = merged.clone()
        k = merged[:, 4 * 32:6 * 32].view(rows, 2, 32)
        expected = plain.head_norm_rope(k.clone(), head_weight, 1e-6, cos, sin)
        fused.ops.head_norm_rope_(k, head_weight, 1e-6, cos, sin)  # the kernel itself, in place
        torch.testing.assert_close(merged[:, 4 * 32:6 * 32].view(rows, 2, 32), expected)
        torch.testing.assert_close(merged[:, :4 * 32], before[:, :4 * 32], rtol=0, atol=0)
        torch.testing.assert_close(merged[:, 6 * 32:], before[:, 6 * 32:], rtol=0, atol=0)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 8, 11, 37])
@pytest.mark.parametrize("width", [96, 2048])  # 2048: panels of 3 blocks, the last one short
def test_float32_kernel_rows_depend_on_themselves_alone(rows, width):
    """Every row count goes through the float32 kernel (AVX-512's, or AVX2's on a CPU without
    it), each output one chain over k in order: the same bits for a row whatever rows share the
    call (batch invariance), and a tied table's rows back exactly. 301 outputs: the last block
    is partly padding."""
    w = torch.randn(301, width, generator=torch.Generator().manual_seed(rows))
    head = DenseLinear(w.clone())
    head.as_head(KERNELS)
    layer = DenseLinear(w.clone(), torch.randn(301))
    layer.prepack(KERNELS)
    assert head.blocked_f32 and layer.blocked_f32 and layer.weight is None
    x = _activations(40, width, seed=rows)
    assert _rel(head(x), (x.double() @ w.double().T).float()) < 1e-5  # summed in float32, in order
    assert torch.equal(head(x[:rows]), head(x)[:rows])
    assert torch.equal(layer(x[rows - 1:rows]), layer(x)[rows - 1:rows])
    ids = torch.tensor([300, 0, 17])
    assert torch.equal(head.lookup(ids), w[ids])
