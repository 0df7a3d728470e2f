"""Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet hybrids) on torch and MLX: greedy output
equals transformers token for token on tiny random checkpoints transformers wrote (text-only and
multimodal layouts, experts with a shared one, Next's grouped projections), through chunked
prefill longer than a prefill chunk and a delta-rule block, mixed-length batches, prefix-cache
hits, preemption and recomputation, and n=2 forks; the two forms of the delta rule agree with transformers' float
reference; every recurrent-state slot comes back."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch
from float32_tiles import use_float32_tiles

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.torch_cpu import delta_rule
from qwen_serve.conformance.models import LinearAttentionGeometry, MoeRouting, make_qwen3_5_checkpoint
from qwen_serve.conformance.reference import hf_greedy
from qwen_serve.models.layers import Attention, DenseMLP, GatedDeltaNet, SparseMoE

NEW_TOKENS = 12
LAYOUTS = {
    "text-only, 3:1": dict(multimodal=False),
    "multimodal, value heads = key heads, every other layer full": dict(
        multimodal=True, linear=LinearAttentionGeometry(linear_num_value_heads=2, full_attention_interval=2)),
    "MoE, multimodal": dict(family="moe", multimodal=True),
    "Next, a dense layer, not renormalized": dict(family="next", routing=MoeRouting(norm_topk_prob=False,
                                                                                     mlp_only_layers=(1,))),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request):
    return LAYOUTS[request.param]


@pytest.fixture(scope="module")
def checkpoint(layout, tmp_path_factory):
    return make_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5"), seed=2, **layout)


@lru_cache(maxsize=None)
def reference(path, prompt: tuple[int, ...]) -> list[int]:
    return hf_greedy(path, list(prompt), NEW_TOKENS)


def prompts(llm: LLM) -> list[list[int]]:
    return [llm.tokenizer.encode("The quick brown fox"),
            llm.tokenizer.encode(" ".join(f"word{i}" for i in range(60))),  # > a 32-token chunk and a 64-token block
            llm.tokenizer.encode("Hi")]


def test_the_description_follows_layer_types(checkpoint, layout):
    config = LLM(str(checkpoint)).config
    interval = layout.get("linear", LinearAttentionGeometry()).full_attention_interval
    assert [type(layer.mixer) for layer in config.layers] == \
        [Attention if (i + 1) % interval == 0 else GatedDeltaNet for i in range(config.num_layers)]
    assert all(layer.mixer.output_gate for layer in config.layers if isinstance(layer.mixer, Attention))
    assert config.rotary_dim == config.head_dim // 4 and config.norm_offset == 1.0
    assert config.kv_layers == config.num_layers // interval
    family = layout.get("family", "dense")
    routing = layout.get("routing", MoeRouting())
    expected_mlp = [DenseMLP() if family == "dense" or i in routing.mlp_only_layers else
                    SparseMoE(routing.num_experts, routing.num_experts_per_tok, routing.moe_intermediate_size,
                              family == "moe" or routing.norm_topk_prob, shared_expert_size=96)
                    for i in range(config.num_layers)]
    assert [layer.mlp for layer in config.layers] == expected_mlp


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
def test_greedy_equals_transformers(checkpoint, kv_cache):
    llm = LLM(str(checkpoint), kv_cache=kv_cache, chunk_size=32)
    batch = prompts(llm)
    outs = llm.generate(batch, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(batch, outs):
        assert out.token_ids == reference(checkpoint, tuple(prompt))
    assert len(set(outs[1].token_ids)) > 3, "a random model should produce varied tokens"
    usage = llm.parts.cache.usage()
    assert usage.states_used == usage.state_snapshots  # no live state left, only the prefix cache's


def test_preemption_recomputes_the_state(checkpoint):
    llm = LLM(str(checkpoint), kv_blocks=14, prefix_cache=False, chunk_size=32)
    batch = prompts(llm)
    outs = llm.generate(batch, SamplingParams(max_tokens=24, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0
    for prompt, out in zip(batch, outs):
        assert out.token_ids[:NEW_TOKENS] == reference(checkpoint, tuple(prompt))
    usage = llm.parts.cache.usage()
    assert usage.used == 0 and usage.states_used == 0


def test_two_choices_each_continue_from_the_prompts_state(checkpoint):
    llm = LLM(str(checkpoint), chunk_size=32)
    prompt = prompts(llm)[1]
    outs = llm.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, n=2))
    assert llm.engine.stats.prefill_tokens_total == len(prompt)  # prefilled once, then forked
    assert [o.token_ids for o in outs] == [reference(checkpoint, tuple(prompt))] * 2
    seeded = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, temperature=1.0, seed=5)
    forked = llm.generate([prompt], SamplingParams(**{**seeded.__dict__, "n": 2}))
    alone = [llm.generate([prompt], SamplingParams(**{**seeded.__dict__, "seed": 5 + i}))[0] for i in range(2)]
    assert [o.token_ids for o in forked] == [o.token_ids for o in alone]
    usage = llm.parts.cache.usage()
    assert usage.states_used == usage.state_snapshots


def test_abort_returns_the_state_slot(checkpoint):
    llm = LLM(str(checkpoint), chunk_size=16)
    engine = llm.engine
    engine.add_request("r", prompts(llm)[1], SamplingParams(max_tokens=NEW_TOKENS, n=2))
    engine.step()
    usage = llm.parts.cache.usage()
    assert usage.states_used - usage.state_snapshots == 1  # the one live state, beside the snapshots
    assert engine.abort("r")
    usage = llm.parts.cache.usage()
    assert usage.states_used == usage.state_snapshots and usage.used == usage.cached


@pytest.mark.parametrize("path", ["torch", "torch per op", "mlx"])
def test_a_next_turn_resumes_inside_the_reply(checkpoint, path):
    """Decoding leaves a state snapshot at each block end it passes, as prefilling does: a next
    turn that sends the prompt and its reply back resumes at the reply's last block end, and its
    tokens are still transformers'."""
    llm = LLM(str(checkpoint), backend="mlx" if path == "mlx" else "torch", chunk_size=32)
    if path == "torch per op":
        llm.parts.executor.fused = None
    first = prompts(llm)[0]
    reply = llm.generate([first], SamplingParams(max_tokens=40, ignore_eos=True))[0].token_ids
    follow = first + reply + llm.tokenizer.encode(" and then")
    cache = llm.parts.cache
    before = cache.state_hit_tokens
    out = llm.generate([follow], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    block = cache.block_size
    assert len(first) < block and cache.state_hit_tokens - before == (len(first) + len(reply) - 1) // block * block > 0
    assert out.token_ids == reference(checkpoint, tuple(follow))


def test_greedy_on_mlx_equals_transformers(checkpoint):
    """Twice: the second time every prompt longer than a block hits the prefix cache, through a
    state snapshot the MLX layer wrote."""
    llm = LLM(str(checkpoint), backend="mlx", chunk_size=32)
    batch = prompts(llm)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for _ in range(2):
        outs = llm.generate(batch, params)
        for prompt, out in zip(batch, outs):
            assert out.token_ids == reference(checkpoint, tuple(prompt))
    usage = llm.parts.cache.usage()
    assert usage.prefix_hit_blocks > 0 and usage.states_used == usage.state_snapshots


def test_a_sliding_window_cache_is_refused(checkpoint):
    with pytest.raises(ValueError, match="sliding-window KV cache cannot serve it"):
        LLM(str(checkpoint), kv_cache="sliding-window", kv_window=64)


# --- the delta rule's two forms against transformers' float reference ---------------------------
def built_kernels():
    """The C++ kernels (the test skips where they are not built)."""
    from qwen_serve.backends.torch_cpu.native import load_kernels

    kernels = load_kernels()
    if kernels is None:
        pytest.skip("the C++ kernels are not built on this machine")
    return kernels


def block_solve(name: str):
    """The chunked form's triangular solve: LAPACK's through torch, or the C++ kernel."""
    from qwen_serve.backends.torch_cpu.gated_deltanet import kernel_solve

    return delta_rule.solve_in_torch if name == "torch" else kernel_solve(built_kernels().ops)


@pytest.mark.parametrize("solve", ["torch", "C++"])
@pytest.mark.parametrize("length,heads,key_dim,value_dim,block", [
    (1, 2, 8, 8, 64), (5, 2, 16, 8, 16), (64, 3, 16, 16, 64), (150, 4, 32, 16, 64), (200, 2, 8, 32, 16),
    (100, 2, 128, 128, 32)])
def test_chunked_and_recurrent_forms_equal_the_reference(length, heads, key_dim, value_dim, block, solve):
    """And the chunked form's states after any token (prefix-cache snapshots) equal the recurrent form's."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    generator = torch.Generator().manual_seed(length)
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    q, k = (torch.nn.functional.normalize(rand(length, heads, key_dim), dim=-1) for _ in range(2))
    v, initial = rand(length, heads, value_dim), rand(heads, key_dim, value_dim)
    g = -2 * torch.rand(length, heads, generator=generator)
    beta = torch.rand(length, heads, generator=generator)
    expected, expected_state = torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                            initial_state=initial[None], output_final_state=True)
    q = q * key_dim ** -0.5  # the reference scales the queries itself
    chunked_state = initial.clone()
    wanted = sorted({1, length // 3 + 1, block, length} & set(range(1, length + 1)))  # inside and at block ends
    snapshots = torch.full((len(wanted), heads, key_dim, value_dim), float("nan"))
    chunked = delta_rule.chunked(chunked_state, q, k, v, g, beta, block, snapshots=list(zip(wanted, snapshots)),
                                 solve=block_solve(solve))
    stepped_state, states_after = initial.clone()[None], {}
    stepped = []
    for t in range(length):
        stepped.append(delta_rule.recurrent_step(stepped_state, q[t][None], k[t][None], v[t][None], g[t][None],
                                                 beta[t][None])[0])
        states_after[t + 1] = stepped_state[0].clone()
    stepped = torch.stack(stepped)
    assert len(snapshots) == len(wanted)
    for count, snapshot in zip(wanted, snapshots):
        torch.testing.assert_close(snapshot, states_after[count], rtol=1e-5, atol=2e-5)
    for out, state in ((chunked, chunked_state), (stepped, stepped_state[0])):
        torch.testing.assert_close(out, expected[0], rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(state, expected_state[0], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("heads,n,cols", [(1, 1, 3), (2, 5, 7), (16, 32, 256), (3, 64, 100), (4, 17, 64)])
def test_the_kernels_triangular_solve_equals_lapacks(heads, n, cols):
    """Columns in whole groups of 64 and a remainder; the diagonal and upper triangle are not read."""
    generator = torch.Generator().manual_seed(n)
    system = torch.randn(heads, n, n, generator=generator) / n ** 0.5
    rhs = torch.randn(heads, n, cols, generator=generator)
    expected = delta_rule.solve_in_torch(system, rhs)
    unread = torch.full((n, n), float("nan")).triu()
    got = block_solve("C++")((system.tril(-1) + unread).contiguous(), rhs.clone())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_the_convolution_carries_its_history_across_chunks():
    generator = torch.Generator().manual_seed(0)
    inputs, weight = torch.randn(11, 6, generator=generator), torch.randn(6, 4, generator=generator)
    whole, _ = delta_rule.causal_conv(torch.zeros(3, 6), inputs, weight)
    first, history = delta_rule.causal_conv(torch.zeros(3, 6), inputs[:7], weight)
    rest, _ = delta_rule.causal_conv(history, inputs[7:], weight)
    stepped, _ = delta_rule.causal_conv_step(history[None], inputs[7][None], weight)
    torch.testing.assert_close(torch.cat([first, rest]), whole)
    torch.testing.assert_close(stepped[0], whole[7])
    expected = torch.nn.functional.silu(torch.nn.functional.conv1d(
        inputs.t()[None], weight[:, None, :], padding=3, groups=6)[0, :, :11].t())
    torch.testing.assert_close(whole, expected)


# --- the C++ decode step against the same step in torch ops --------------------------------------
def small_layer_and_kernels(key_heads: int, value_heads: int):
    """A small Gated DeltaNet layer's kind and the built kernels (the test skips where they are not)."""
    kernels = built_kernels()
    return GatedDeltaNet(num_key_heads=key_heads, num_value_heads=value_heads, key_dim=16, value_dim=32,
                         conv_kernel=4), kernels


@pytest.mark.parametrize("key_heads,value_heads,fresh", [(2, 4, (False, True, False)), (3, 3, (False, False, False))])
def test_the_decode_kernel_equals_torch_ops(key_heads, value_heads, fresh):
    from qwen_serve.backends.torch_cpu.gated_deltanet import in_torch_ops
    from qwen_serve.backends.torch_cpu.state_storage import TorchStateStorage

    kind, kernels = small_layer_and_kernels(key_heads, value_heads)
    generator = torch.Generator().manual_seed(key_heads)
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    storages = [TorchStateStorage([kind, kind], max_slots=6) for _ in range(2)]
    for storage in storages:
        storage.ensure_slots(6)
    for layer in (0, 1):  # the same earlier states in both
        history, state = rand(6, *kind.state_shapes()[0]), rand(6, *kind.state_shapes()[1])
        for storage in storages:
            storage.write(layer, torch.arange(6), history, state)
    slots, fresh = torch.tensor([4, 1, 3]), torch.tensor(fresh)
    width = value_heads * kind.value_dim
    merged = rand(3, kind.conv_channels + width)  # the kernel reads column slices, as the layer gives it
    mixed, z = merged[:, :kind.conv_channels], merged[:, kind.conv_channels:]
    conv, out_norm = rand(kind.conv_channels, 4), rand(kind.value_dim)
    gates = 4 * rand(3, 2 * value_heads)  # a and b; softplus(a + dt_bias) reaches its linear part past 20
    gates[0, 0] = 30.0
    decay_rate, dt_bias = -rand(value_heads).exp(), rand(value_heads)
    a, b = gates.split(value_heads, dim=-1)
    g, beta = decay_rate * torch.nn.functional.softplus(a + dt_bias), torch.sigmoid(b)
    expected = in_torch_ops(kind, conv, out_norm, storages[0], 1, slots, fresh, mixed, z, g, beta, 1e-6, chunked=False)
    got = kernels.ops.gated_delta_decode_(mixed, z, conv.t().contiguous(), storages[1].conv_history[1],
                                          storages[1].recurrent[1], slots, fresh, gates, decay_rate, dt_bias, out_norm,
                                          key_heads, 1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for a, b in ((storages[0].conv_history, storages[1].conv_history), (storages[0].recurrent, storages[1].recurrent)):
        torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)  # the states advanced alike, in place
        torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)  # the other layer untouched


@pytest.mark.parametrize("key_heads,value_heads,fresh,length", [(2, 4, True, 70), (3, 3, False, 2), (1, 2, False, 5)])
def test_a_prefill_chunk_in_kernels_equals_torch_ops(key_heads, value_heads, fresh, length):
    """The chunk's convolution and gate in C++ against in_torch_ops: its output, the state and history
    it leaves, and the snapshots taken inside it (one before the history's length, one past a
    delta-rule block)."""
    from qwen_serve.backends.torch_cpu.gated_deltanet import chunk_in_kernel, in_torch_ops
    from qwen_serve.backends.torch_cpu.state_storage import TorchStateStorage

    kind, kernels = small_layer_and_kernels(key_heads, value_heads)
    generator = torch.Generator().manual_seed(length)
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    storages = [TorchStateStorage([kind], max_slots=4) for _ in range(2)]
    history, state = rand(4, *kind.state_shapes()[0]), rand(4, *kind.state_shapes()[1])
    for storage in storages:
        storage.ensure_slots(4)
        storage.write(0, torch.arange(4), history, state)
    width = value_heads * kind.value_dim
    merged = rand(length, kind.conv_channels + width)
    mixed, z = merged[:, :kind.conv_channels], merged[:, kind.conv_channels:]
    conv, out_norm = rand(kind.conv_channels, 4), rand(kind.value_dim)
    g = -torch.rand(length, value_heads, generator=generator)
    beta = torch.rand(length, value_heads, generator=generator)
    snapshots = [(rows, slot) for rows, slot in ((1, 0), (length - 1, 1), (66, 3)) if 1 <= rows <= length]
    expected = in_torch_ops(kind, conv, out_norm, storages[0], 0, torch.tensor([2]), torch.tensor([fresh]), mixed, z,
                            g, beta, 1e-6, chunked=True, snapshots=snapshots)
    got = chunk_in_kernel(kind, kernels.ops, conv.t().contiguous(), out_norm, storages[1], 0, 2, fresh, mixed, z, g, beta, 1e-6,
                          snapshots)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for a, b in ((storages[0].conv_history[0], storages[1].conv_history[0]),
                 (storages[0].recurrent[0], storages[1].recurrent[0])):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)  # slot 2 and the snapshots' slots alike


@pytest.mark.parametrize(("disabled", "table"), [("", "int8"), ("avx512_vnni", "int8"), ("avx512_vnni", "int6")])
def test_int4_equals_transformers_on_the_int4_grid(checkpoint, monkeypatch, disabled, table):
    """The int4 path (the linear-attention projections, the split gate of q_proj, the experts and
    the shared one, the int8 or int6 table) against transformers on the same weights moved onto
    int4's grid: log-probabilities within the activations' rounding (int16 on AVX-512 without VNNI:
    measured under 0.01; int8 with VNNI or on AVX2, which these random layers amplify: measured up
    to 0.2), and the same token unless the rounding could tip a near-tie. The int6 table is taken
    without VNNI, where its rows go through float tiles, so the table itself is checked tightly (its
    kernel: test_torch_kernels; with int8 activations, the random experts' routing amplified them to
    0.5 on the MoE layout)."""
    from qwen_serve.backends.torch_cpu import native
    from qwen_serve.backends.torch_cpu.backend import TorchBackend
    from qwen_serve.conformance.reference import assert_first_tokens_match, hf_model_on_int4_grid
    from qwen_serve.registry import BackendEntry, load_registry

    monkeypatch.setenv(native.DISABLE_ENV, disabled)
    registry = load_registry()
    registry.backends["torch-table"] = BackendEntry("torch-table", lambda: TorchBackend(head_quant=table))
    llm = LLM(str(checkpoint), quant="int4", calibrate=False, backend="torch-table", registry=registry)
    hf = hf_model_on_int4_grid(checkpoint, table)  # the same grid: no importance
    use_float32_tiles(llm)
    kernels = native.load_kernels()
    tolerance = 0.25 if kernels is not None and kernels.int8_activations else 0.02
    assert_first_tokens_match(llm, hf, ("Hello, world!", "The quick brown fox", "1 2 3 4 5"), tolerance,
                              tie_margin=2 * tolerance)


# --- prefix caching through state snapshots -------------------------------------------------------
SYSTEM = "You are the help desk of a small library. " * 8


def test_a_shared_prefix_is_served_from_a_state_snapshot(checkpoint):
    llm = LLM(str(checkpoint), chunk_size=48)  # snapshots inside chunks, not only at their ends
    first, second = (llm.tokenizer.encode(SYSTEM + question) for question in ("When do you open?", "Can I print?"))
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    block = llm.parts.engine_config.block_size
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate([first], params)
    before = llm.engine.stats.prefill_tokens_total
    out = llm.generate([second], params)[0]
    assert llm.engine.stats.prefill_tokens_total - before == len(second) - shared // block * block
    assert out.token_ids == reference(checkpoint, tuple(second))
    usage = llm.parts.cache.usage()
    assert usage.state_snapshots > 0 and usage.states_used == usage.state_snapshots  # no live state left
    assert usage.used == usage.cached


def test_snapshots_stay_within_their_budget(checkpoint):
    llm = LLM(str(checkpoint), chunk_size=48, state_cache_mib=1)
    cache = llm.parts.cache
    cache.snapshot_capacity = 3  # of the slots 1 MiB holds, only three for snapshots
    prompts = [llm.tokenizer.encode(SYSTEM + f"Question {i}?") for i in range(3)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference(checkpoint, tuple(prompt))
    usage = cache.usage()
    assert 0 < usage.state_snapshots <= 3 and usage.states_used == usage.state_snapshots


def test_a_hit_backs_off_below_evicted_blocks(checkpoint):
    llm = LLM(str(checkpoint), chunk_size=48, kv_blocks=7, max_batch=2)
    first, second = (llm.tokenizer.encode(SYSTEM + question) for question in ("When do you open?", "Can I print?"))
    other = llm.tokenizer.encode("An unrelated request that needs blocks of its own. " * 4)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    llm.generate([first], params)
    llm.generate([other], params)  # evicts the least recently used of first's cached blocks: its last
    block = llm.parts.engine_config.block_size
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b) // block * block
    before = llm.engine.stats.prefill_tokens_total
    out = llm.generate([second], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    cached = len(second) - (llm.engine.stats.prefill_tokens_total - before)
    assert 0 < cached < shared and llm.parts.cache.usage().prefix_hit_blocks == cached // block
    assert out.token_ids == reference(checkpoint, tuple(second))
    usage = llm.parts.cache.usage()
    assert usage.states_used == usage.state_snapshots and usage.used == usage.cached


class ReferenceWithSlips:
    """Proposes transformers' own continuation, but slips at a place that moves with the output
    length (draft i wrong when i == len(output) % (max_tokens + 1)), so steps keep every draft,
    some of them, or none, and the state is rolled back to each position a draft can end at."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]]) -> None:
        self.continuations = continuations

    def propose(self, token_ids, max_tokens):
        tokens = list(token_ids)
        prompt = next(p for p in self.continuations if tuple(tokens[:len(p)]) == p)
        done = len(tokens) - len(prompt)
        draft = self.continuations[prompt][done:done + max_tokens]
        slip = done % (max_tokens + 1)
        if slip < len(draft):
            draft[slip] = (draft[slip] + 1) % 1000
        return draft


def registry_with(name: str, proposer):
    from qwen_serve.hookspecs import hookimpl
    from qwen_serve.registry import load_registry, make_plugin_manager

    class Plugin:
        @hookimpl
        def register_proposers(self, register):
            register(name, lambda engine_config: proposer)

    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    pm.register(Plugin(), name=f"{name}-plugin")
    return load_registry(pm=pm)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_with_speculation_equals_transformers(checkpoint, backend):
    """Drafts verified in one pass, rejected ones rolled back through the states the cache kept
    after each draft position; twice, so the second pass starts from prefix-cache snapshots."""
    tokenizer = LLM(str(checkpoint), kv_blocks=4).tokenizer
    batch = [tokenizer.encode("The quick brown fox"), tokenizer.encode(" ".join(f"word{i}" for i in range(60)))]
    proposer = ReferenceWithSlips({tuple(p): reference(checkpoint, tuple(p)) for p in batch})
    llm = LLM(str(checkpoint), backend=backend, chunk_size=32, registry=registry_with("slips", proposer),
              speculative="slips", num_speculative_tokens=3)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for _ in range(2):
        outs = llm.generate(batch, params)
        for prompt, out in zip(batch, outs):
            assert out.token_ids == reference(checkpoint, tuple(prompt))
    stats = llm.engine.stats
    assert 0 < stats.accepted_draft_tokens_total < stats.draft_tokens_total
    usage = llm.parts.cache.usage()
    assert usage.states_used == usage.state_snapshots and usage.used == usage.cached
