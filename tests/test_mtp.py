"""Multi-token prediction (``--speculative mtp``): the checkpoint's own MTP head drafts, the
model verifies. Its guesses equal a head assembled from transformers' own modules (the model's
decoder-layer class, its RMSNorm, its rotary embedding) at every step of every sequence, through
chunked prefill, mixed batches and verification; greedy output equals transformers with the
head on, on torch and on MLX; a checkpoint without a head is a clear error; and without ``mtp``
the head is not even read."""
from __future__ import annotations

import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.models import add_mtp_head, make_qwen3_5_checkpoint
from qwen_serve.conformance.reference import hf_greedy, hf_mtp_drafts
from qwen_serve.errors import ModelLoadError

LAYOUTS = {"text-only": dict(), "multimodal": dict(multimodal=True), "MoE": dict(family="moe", multimodal=True),
           "Next": dict(family="next")}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def checkpoint(request, tmp_path_factory):
    directory = make_qwen3_5_checkpoint(tmp_path_factory.mktemp("mtp"), seed=3, **LAYOUTS[request.param])
    return add_mtp_head(directory, seed=3)


def drafts_compared_with_transformers(llm: LLM, checkpoint, prompts: list[list[int]],
                                      params: list[SamplingParams]) -> int:
    """Runs the requests step by step; after every step each waiting draft must equal the
    transformers-built head's. Returns how many were compared."""
    engine = llm.engine
    seqs = [engine.add_request(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params))]
    compared = 0
    while engine.has_unfinished():
        engine.step()
        for seq in seqs:
            if seq.next_draft:
                assert seq.next_draft == hf_mtp_drafts(checkpoint, seq.token_ids(), len(seq.next_draft))
                compared += 1
    return compared


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_drafts_equal_a_head_built_from_transformers_modules(checkpoint, backend):
    llm = LLM(str(checkpoint), backend=backend, chunk_size=16, speculative="mtp", num_speculative_tokens=3)
    # 40 tokens first (three chunks): its later chunks share steps with the others' decodes
    prompts = [list(range(100, 140)), list(range(50, 60)), list(range(1, 8)), list(range(7, 30))]
    params = [SamplingParams(max_tokens=6 + i, ignore_eos=True, speculative=i != 1) for i in range(4)]
    assert drafts_compared_with_transformers(llm, checkpoint, prompts, params) >= 12
    assert llm.engine.stats.draft_tokens_total > 0


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_accepted_drafts_beside_decodes_continue_from_their_own_rows(tmp_path, backend):
    """On a 4-token vocabulary some drafts are accepted (about 1 in 10 here), so a verified chunk
    keeps several rows beside the one-row decodes of a request that never speculates (second in
    the step's order; MLX lays a step's rows out one-row chunks first, and the head must read
    each chunk's own rows back in the step's order)."""
    from dataclasses import replace

    from qwen_serve.conformance import speculation
    from qwen_serve.conformance.models import QWEN3_5_TINY

    directory = make_qwen3_5_checkpoint(tmp_path, replace(QWEN3_5_TINY, vocab_size=speculation.VOCAB), seed=7,
                                        init_std=0.1)
    add_mtp_head(directory, seed=7, init_std=0.1)
    llm = LLM(str(directory), backend=backend, speculative="mtp", num_speculative_tokens=3)
    prompts = [[0, 1, 2, 3, 2], [3, 3, 1], [2, 0, 1, 1, 0, 3]]
    params = [SamplingParams(max_tokens=16, ignore_eos=True, speculative=i != 1) for i in range(3)]
    assert drafts_compared_with_transformers(llm, directory, prompts, params) >= 8
    stats = llm.engine.stats
    assert stats.accepted_draft_tokens_total > 0


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_with_mtp_equals_transformers(checkpoint, backend):
    llm = LLM(str(checkpoint), backend=backend, chunk_size=16, speculative="mtp", num_speculative_tokens=2)
    prompts = [list(range(1, 8)), list(range(100, 140))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(checkpoint, prompt, 10)
    assert llm.engine.stats.draft_tokens_total > 0
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached and usage.states_used == usage.state_snapshots


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_prefix_hit_with_mtp_equals_transformers(checkpoint, backend):
    """The head runs over prefill chunks too, but the states left for the prefix cache are the
    decoder's alone: each chunk asks for its snapshot slots once (asking again took a second
    slot for the same position, never written), and a second prompt sharing 40 tokens starts
    from position 32 and still decodes as transformers does."""
    llm = LLM(str(checkpoint), backend=backend, chunk_size=16, speculative="mtp", num_speculative_tokens=2)
    cache, asked = llm.parts.cache, []
    ask = cache.snapshot_slots
    cache.snapshot_slots = lambda *args: asked.append(args) or ask(*args)
    shared = list(range(100, 140))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    llm.generate([shared + [7, 8]], params)
    assert [args[1:3] for args in asked[:3]] == [(0, 16), (16, 32), (32, 42)]  # the prompt's three chunks, once each
    second = shared + [9, 10, 11]
    before = llm.engine.stats.prefill_tokens_total
    assert llm.generate([second], params)[0].token_ids == hf_greedy(checkpoint, second, 8)
    assert llm.engine.stats.prefill_tokens_total - before == len(second) - 32
    usage = cache.usage()
    assert usage.states_used == usage.state_snapshots > 0


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_head_is_read_only_for_mtp(checkpoint, backend):
    plain, drafting = LLM(str(checkpoint), backend=backend), LLM(str(checkpoint), backend=backend, speculative="mtp")
    assert not plain.parts.model_config.draft_layers and plain.parts.executor.draft_head is None
    assert drafting.parts.model_config.kv_layers == plain.parts.model_config.kv_layers + 1
    assert drafting.parts.executor.weight_bytes() > plain.parts.executor.weight_bytes()


def test_the_heads_float_fc_takes_the_kernels_layout(checkpoint):
    """mtp.fc is not a projection (it stays float under int4), and it went through torch's
    unpacked float matmul: 0.59 ms a draft round at Qwen3.5-0.8B's 2,048 x 1,024 (cProfile), a
    tenth of the rounds' time once the head is narrowed."""
    from qwen_serve.backends.torch_cpu.native import load_kernels

    fc = LLM(str(checkpoint), speculative="mtp").parts.executor.draft_head.fc
    if load_kernels() is None:
        pytest.skip("no torch kernels built on this machine")
    assert fc.blocked is not None and fc.weight is None


def test_a_checkpoint_without_a_head_is_a_clear_error(tmp_path):
    directory = make_qwen3_5_checkpoint(tmp_path, seed=3)
    with pytest.raises(ModelLoadError, match="declares none"):
        LLM(str(directory), speculative="mtp")


def test_int4_with_the_head_decodes_as_int4_without_it(checkpoint, tmp_path, monkeypatch):
    """The head's projections are int4 like the decoder's; calibration runs without speculation
    (it once refused to start: its engine had no proposer). Both take the quantized kernels at
    every row count: a decode's one row and a verified chunk's three fall in different row
    classes, whose paths are chosen by timing, and only the kernels compute a row the same way
    however many come with it (under a busy CPU the timing once chose otherwise, and the outputs
    parted at the second token)."""
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(tmp_path))  # measured here, not read from an earlier run
    monkeypatch.setenv("QWEN_SERVE_KERNELS", "int4=kernel,int6=kernel,int8=kernel")
    prompt = list(range(1, 30))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    drafting = LLM(str(checkpoint), quant="int4", speculative="mtp", num_speculative_tokens=2)  # first: nothing cached
    assert drafting.parts.calibration == "by the activations of the calibration text"
    plain = LLM(str(checkpoint), quant="int4")
    assert drafting.generate([prompt], params)[0].token_ids == plain.generate([prompt], params)[0].token_ids
    assert drafting.engine.stats.draft_tokens_total > 0
    # One measurement for both: a model built with its head once calibrated apart, and where the
    # other's had been cached by an earlier version of the code (1.6e-5 relative apart) its decoder
    # got other int4 codes (on Qwen3.5-0.8B's geometry 95 of 96 projections, and greedy tokens
    # parted at the first one).
    assert len(list((tmp_path / "importance").glob("*.npz"))) == 1
    for a, b in zip(drafting.parts.executor.layers, plain.parts.executor.layers):
        for x, y in zip(a.linears(), b.linears()):
            assert torch.equal(x.codes, y.codes) if hasattr(x, "codes") else True


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_sampled_output_with_the_head_keeps_the_distribution(tmp_path, backend):
    """Check 7 with the head as the proposer on each backend, on a 4-token hybrid (Qwen3.5 with an MTP
    head): the first tokens of 4,000 seeded requests against transformers' exact joint distribution."""
    from dataclasses import replace

    from qwen_serve.conformance import speculation
    from qwen_serve.conformance.models import QWEN3_5_TINY

    directory = make_qwen3_5_checkpoint(tmp_path, replace(QWEN3_5_TINY, vocab_size=speculation.VOCAB), seed=7,
                                        init_std=0.1)
    add_mtp_head(directory, seed=7, init_std=0.1)
    llm = LLM(str(directory), backend=backend, speculative="mtp", num_speculative_tokens=speculation.SPECULATIVE_TOKENS,
              max_batch=64)
    sampled = speculation.sample_joint(llm)
    statistic, df, p_value = speculation.chi_square(sampled.counts, speculation.exact_joint(directory))
    assert 0 < sampled.accepted < sampled.drafts
    assert p_value > speculation.ALPHA, f"chi2 {statistic:.1f} on {df} df, p = {p_value:.2g}"
