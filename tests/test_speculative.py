"""Speculative decoding: the n-gram proposer, rewinding the KV caches, and the
engine's promise that greedy output is the same with and without speculation, across prefix
hits and preemption, without losing a block to a rejected draft."""
from __future__ import annotations

import numpy as np
import pytest
from engine_steps import assert_blocks_accounted, step_until_done
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from numpy_kv_storage import NumpyKVStorage

from qwen_serve import LLM, SamplingParams
from qwen_serve.kv.naive import NaiveKVCache
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.plugins.ngram.proposer import NgramProposer
from qwen_serve.protocols import Rewinding

# Prompts with repeats (so the n-gram proposer has something to find) and without.
PROMPTS = [[5, 6, 7, 8] * 5, [5, 6, 7, 8] * 4 + [9, 10, 11], [12, 13] * 9, [14] * 3, list(range(100, 140)) * 2,
           list(range(300, 337))]
GREEDY = SamplingParams(max_tokens=30, ignore_eos=True)


# --- the proposer ---------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_longest_suffix_match():
    proposer = NgramProposer(max_n=3, min_n=1)
    # the 3-gram (1, 2, 3) occurred at 0 and was followed by 9, 9; the 1-gram 3 alone also at 5 (-> 7)
    assert proposer.propose([1, 2, 3, 9, 9, 3, 7, 1, 2, 3], 2) == [9, 9]
    assert proposer.propose([1, 2, 3, 9, 9, 3, 7, 1, 2, 3], 5) == [9, 9, 3, 7, 1]


def test_ngram_takes_the_most_recent_occurrence_and_falls_back_to_shorter_ngrams():
    proposer = NgramProposer(max_n=3, min_n=1)
    assert proposer.propose([4, 1, 5, 4, 2, 6, 4], 1) == [2]  # 4 was last followed by 2
    assert proposer.propose([8, 4, 2, 3, 9, 8, 4], 3) == [2, 3, 9]  # (8, 4) beats the lone 4
    assert proposer.propose([1, 2, 3, 4], 3) == []  # nothing repeats
    assert proposer.propose([7], 3) == []
    assert proposer.propose([7, 7, 7], 0) == []
    assert NgramProposer(max_n=3, min_n=2).propose([4, 1, 5, 4], 2) == []  # a 1-gram match is not enough


def test_ngram_rejects_bad_sizes():
    with pytest.raises(ValueError):
        NgramProposer(max_n=1, min_n=2)


# --- rewinding the caches ---------------------------------------------------------------------
def storage(blocks: int = 16) -> NumpyKVStorage:
    return NumpyKVStorage(num_layers=1, kv_heads=1, head_dim=2, block_size=4, slab_blocks=4, max_blocks=blocks)


def test_paged_rewind_releases_only_blocks_past_the_kept_length():
    cache = PagedKVCache(storage(), block_size=4, num_blocks=16)
    assert isinstance(cache, Rewinding)
    assert cache.allocate_slots(0, 0, 6)  # 2 blocks
    assert cache.allocate_slots(0, 6, 5)  # drafts: positions 6..10 -> 3 blocks
    assert cache.usage().used == 3
    cache.rewind(0, 8)  # positions 0..7 fill exactly 2 blocks
    assert len(cache.block_table(0)) == 2 and cache.usage().used == 2
    cache.rewind(0, 5)
    assert len(cache.block_table(0)) == 2  # position 4 still lives in the second block
    cache.free(0)
    assert cache.usage().used == 0


def test_paged_rewind_never_touches_a_published_block_or_another_sequences_share():
    cache = PagedKVCache(storage(), block_size=4, num_blocks=16)
    tokens = list(range(12))
    assert cache.allocate_slots(0, 0, 9)
    cache.publish(0, tokens, 8)  # blocks 0 and 1 are findable now
    with pytest.raises(ValueError, match="published"):
        cache.rewind(0, 7)
    cache.fork(0, 1)  # the child shares all three blocks
    third = cache.block_table(0)[2]
    assert cache.allocate_slots(1, 9, 3)  # the child writes drafts into the shared third block: copied first
    assert cache.block_table(1)[2] != third and cache.usage().cow_copies == 1
    assert cache.allocate_slots(1, 12, 2)  # and one more block
    cache.rewind(1, 9)
    assert list(cache.block_table(0)) == list(cache.block_table(1))[:2] + [third]
    assert cache.pool.ref_cnt[third] == 1 and len(cache.block_table(1)) == 3
    cache.free(0)
    cache.free(1)
    usage = cache.usage()
    assert usage.used == usage.cached == 2  # only the published blocks stay, held by the prefix cache


def test_naive_rewind_keeps_its_reservation():
    cache = NaiveKVCache(storage(), block_size=4, num_blocks=16)
    assert isinstance(cache, Rewinding)
    assert cache.allocate_slots(0, 0, 5, expected_total=12)
    cache.rewind(0, 3)
    assert cache.usage().used == 3 and cache.reserved_tokens(0) == 12
    with pytest.raises(ValueError):
        cache.rewind(0, 13)


# --- the engine -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(qwen3_tiny) -> str:
    return str(qwen3_tiny)


@pytest.fixture(scope="module")
def greedy_reference(tiny):
    return [o.token_ids for o in LLM(tiny).generate(PROMPTS, GREEDY)]


def run_checked(llm: LLM, prompts, params) -> list[list[int]]:
    """Run to the end, checking block accounting after every step (paged caches)."""
    engine = llm.engine
    seqs = [engine.add_request(f"r{id(llm)}-{i}", p, params) for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        engine.step()
        if isinstance(llm.parts.cache, PagedKVCache):
            assert_blocks_accounted(llm.parts.cache)
    return [s.output_token_ids for s in seqs]


@pytest.mark.parametrize("kv_cache", ["paged", "naive"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_is_identical_with_speculation(tiny, greedy_reference, kv_cache, k):
    llm = LLM(tiny, kv_cache=kv_cache, speculative="ngram", num_speculative_tokens=k)
    assert run_checked(llm, PROMPTS, GREEDY) == greedy_reference
    stats = llm.engine.stats
    assert stats.accepted_draft_tokens_total > 0, "some drafts should have been accepted"
    assert stats.draft_tokens_total > stats.accepted_draft_tokens_total, "some drafts should have been rejected"
    assert stats.decode_tokens_total == sum(len(t) - 1 for t in greedy_reference)  # each kept position once
    assert run_checked(llm, PROMPTS, GREEDY) == greedy_reference  # again: prefix-cache hits (paged)
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached  # nothing but the prefix cache holds a block
    if kv_cache == "paged":
        assert usage.prefix_hit_blocks > 0


def test_greedy_is_identical_across_preemption(tiny, greedy_reference):
    """A pool too small for the batch: sequences are preempted and recomputed mid-decode."""
    llm = LLM(tiny, kv_blocks=12, speculative="ngram", num_speculative_tokens=4, chunk_size=16, step_budget=32)
    assert run_checked(llm, PROMPTS, GREEDY) == greedy_reference
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.stats.accepted_draft_tokens_total > 0
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path):
    return LLM(str(smollm2_path)), LLM(str(smollm2_path), speculative="ngram", num_speculative_tokens=4)


REPEAT = "Repeat this text exactly: The quick brown fox jumps over the lazy dog near the quiet river bank."


def test_stop_tokens_and_strings_inside_accepted_drafts_end_where_decoding_would(smollm2_pair):
    """On a real model copying its input most drafts are kept, so stops land inside verified chunks."""
    plain, spec = smollm2_pair
    prompt = plain.tokenizer.encode_chat([{"role": "user", "content": REPEAT}])
    full = plain.generate([prompt], SamplingParams(max_tokens=40))[0]
    assert "lazy dog" in full.text
    stop_id = full.token_ids[len(full.token_ids) // 2]
    cases = [SamplingParams(max_tokens=40), SamplingParams(max_tokens=40, stop_token_ids=[stop_id]),
             SamplingParams(max_tokens=40, stop=["lazy"]), SamplingParams(max_tokens=40, stop=["y d"]),
             SamplingParams(max_tokens=7)]
    for params in cases:
        want, got = plain.generate([prompt], params)[0], spec.generate([prompt], params)[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    stats = spec.engine.stats
    assert stats.accepted_draft_tokens_total > stats.draft_tokens_total / 2, "a copying task keeps most drafts"
    usage = spec.parts.cache.usage()
    assert usage.used == usage.cached


def test_requests_with_logits_processors_logprobs_or_an_opt_out_do_not_speculate(tiny):
    llm = LLM(tiny, speculative="ngram", num_speculative_tokens=4)
    for params in (SamplingParams(max_tokens=12, presence_penalty=0.5), SamplingParams(max_tokens=12, logprobs=2),
                   SamplingParams(max_tokens=12, min_tokens=3), SamplingParams(max_tokens=12, speculative=False)):
        llm.generate([PROMPTS[3]], params)
    assert llm.engine.stats.draft_tokens_total == 0
    llm.generate([PROMPTS[3]], SamplingParams(max_tokens=12))
    assert llm.engine.stats.draft_tokens_total > 0


def test_seeded_sampling_with_speculation_is_reproducible_and_survives_preemption(tiny):
    """Vocabulary-wide random tokens rarely repeat, so sample at a low temperature where drafts
    are proposed and sometimes rejected."""
    params = SamplingParams(temperature=0.2, seed=5, max_tokens=30, ignore_eos=True)
    big = LLM(tiny, speculative="ngram", num_speculative_tokens=4)
    first = big.generate(PROMPTS, params)
    assert [o.token_ids for o in big.generate(PROMPTS, params)] == [o.token_ids for o in first]
    assert big.engine.stats.accepted_draft_tokens_total > 0
    assert big.engine.stats.draft_tokens_total > big.engine.stats.accepted_draft_tokens_total
    small = LLM(tiny, kv_blocks=12, speculative="ngram", num_speculative_tokens=4, chunk_size=16, step_budget=32)
    assert run_checked(small, PROMPTS, params) == [o.token_ids for o in first]
    assert small.engine.scheduler.num_preemptions > 0


def test_int4_with_speculation_decodes_as_int4_without_it(tiny, tmp_path, monkeypatch):
    """Calibration (which int4 runs first) goes without speculation: it once refused to start.
    Both take the quantized kernels at every row count, as test_mtp's twin says why: the steps
    with drafts have more rows, whose paths are chosen by timing."""
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(tmp_path))  # measured here, not read from an earlier run
    monkeypatch.setenv("QWEN_SERVE_KERNELS", "int4=kernel,int6=kernel,int8=kernel")
    spec = LLM(tiny, quant="int4", speculative="ngram", num_speculative_tokens=3)  # first: nothing cached yet
    plain = LLM(tiny, quant="int4")
    assert spec.parts.calibration == plain.parts.calibration == "by the activations of the calibration text"
    assert [o.token_ids for o in spec.generate(PROMPTS[:3], GREEDY)] == \
        [o.token_ids for o in plain.generate(PROMPTS[:3], GREEDY)]
    assert spec.engine.stats.accepted_draft_tokens_total > 0


def test_a_cache_that_cannot_rewind_runs_without_speculation(tiny, greedy_reference):
    llm = LLM(tiny, kv_cache="sliding-window", kv_window=4096, speculative="ngram")
    assert not isinstance(llm.parts.cache, Rewinding)
    assert llm.engine.drafter is None
    assert [o.token_ids for o in llm.generate(PROMPTS[:2], GREEDY)] == greedy_reference[:2]


def test_a_plugin_proposer_is_found_through_the_hook(tiny, greedy_reference):
    """A proposer registered by a plugin (always guessing token 5) is used by name; its bad
    guesses cost nothing but compute."""
    from qwen_serve.hookspecs import hookimpl
    from qwen_serve.registry import load_registry, make_plugin_manager

    class Fives:
        def propose(self, token_ids, max_tokens):
            return [5] * max_tokens

    class Plugin:
        @hookimpl
        def register_proposers(self, register):
            register("fives", lambda engine_config: Fives())

    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    pm.register(Plugin(), name="fives-plugin")
    try:
        registry = load_registry(pm=pm)
        assert registry.proposers["fives"].plugin == "fives-plugin" and "ngram" in registry.proposers
        llm = LLM(tiny, registry=registry, speculative="fives", num_speculative_tokens=3)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == greedy_reference
        assert llm.engine.stats.draft_tokens_total > 0
    finally:
        pm.unregister(name="fives-plugin")


def test_a_bad_speculative_token_count_is_a_one_line_cli_error(capsys):
    from qwen_serve.server.cli import main

    assert main(["--speculative", "ngram", "--num-speculative-tokens", "0", "--port", "0"]) == 2
    assert "num_speculative_tokens must be a positive integer" in capsys.readouterr().err


def test_verified_rows_are_the_chunks_last_positions(tiny):
    """The executor's contract: a chunk with k drafts gives the logits of its last k + 1
    positions, equal to decoding those positions one at a time."""
    from qwen_serve.protocols import ScheduledChunk, StepBatch

    llm = LLM(tiny, prefix_cache=False)
    executor, cache = llm.parts.executor, llm.parts.cache
    tokens = PROMPTS[1]
    assert cache.allocate_slots(0, 0, len(tokens))
    whole = executor.execute(StepBatch((ScheduledChunk(0, tokens, 0, True, num_draft=3),)), cache)
    assert tuple(whole.shape) == (4, llm.config.vocab_size)
    cache.free(0)
    assert cache.allocate_slots(1, 0, len(tokens))
    executor.execute(StepBatch((ScheduledChunk(1, tokens[:-3], 0, False),)), cache)
    rows = [executor.execute(StepBatch((ScheduledChunk(1, tokens[i:i + 1], i, True),)), cache)
            for i in range(len(tokens) - 4, len(tokens))]
    np.testing.assert_allclose(whole.numpy(), np.concatenate([r.numpy() for r in rows]), rtol=1e-4, atol=1e-4)


def test_mlx_greedy_is_identical_with_speculation(tiny):
    """The MLX executor gives a drafted chunk's rows the same way (its step layout), and its
    sampler verifies sampled drafts too (check 7 runs on it)."""
    from qwen_serve.protocols import DraftVerifying

    plain = LLM(tiny, backend="mlx")
    spec = LLM(tiny, backend="mlx", speculative="ngram", num_speculative_tokens=4)
    assert isinstance(spec.engine.sampler, DraftVerifying)
    prompts = PROMPTS[1:4]
    assert run_checked(spec, prompts, GREEDY) == [o.token_ids for o in plain.generate(prompts, GREEDY)]
    assert spec.engine.stats.accepted_draft_tokens_total > 0


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(st.sampled_from(range(len(PROMPTS))), st.integers(1, 3), st.integers(1, 20),
                                   st.one_of(st.none(), st.integers(0, 8))), min_size=2, max_size=5),
       kv_blocks=st.integers(11, 13), prefix_cache=st.booleans(), k=st.integers(1, 5))
def test_drafts_forks_preemption_and_aborts_never_lose_a_block(tiny, greedy_reference, requests, kv_blocks,
                                                               prefix_cache, k):
    """Greedy requests of 1-3 choices in a small pool with speculation, some aborted after a few
    steps: block accounting holds at every step, only prefix-cache blocks stay at the end, and
    every choice that ran to the end produced the greedy reference's first max_tokens tokens."""
    llm = LLM(tiny, kv_blocks=kv_blocks, prefix_cache=prefix_cache, chunk_size=16, step_budget=32,
              speculative="ngram", num_speculative_tokens=k)
    engine, cache = llm.engine, llm.parts.cache
    aborts: dict[int, list[str]] = {}
    for i, (prompt, n, max_tokens, abort_after) in enumerate(requests):
        engine.add_request(f"r{i}", PROMPTS[prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n))
        if abort_after is not None:
            aborts.setdefault(abort_after, []).append(f"r{i}")
    choices = {f"r{i}": list(engine.sequences[f"r{i}"]) for i in range(len(requests))}
    step_until_done(engine, aborts, lambda: assert_blocks_accounted(cache))
    event(f"preempted: {engine.scheduler.num_preemptions > 0}")
    event(f"drafts kept: {engine.stats.accepted_draft_tokens_total > 0}")
    usage = cache.usage()
    assert usage.used == usage.cached and cache.sequence_ids() == []
    if not prefix_cache:
        assert usage.used == 0
    for i, (prompt, _, max_tokens, _) in enumerate(requests):
        for seq in choices[f"r{i}"]:
            if seq.finish_reason != "abort":
                assert seq.output_token_ids == greedy_reference[prompt][:max_tokens]


def test_metrics_count_drafts_and_kept_tokens(tiny):
    """/metrics JSON and the Prometheus text carry the proposals verified and kept."""
    from prometheus_client import CollectorRegistry, generate_latest

    from qwen_serve.engine.stats import EngineSnapshot, ThroughputWindow
    from qwen_serve.server.metrics import ServerMetrics
    from qwen_serve.server.prometheus import EngineGauges

    llm = LLM(tiny, speculative="ngram", num_speculative_tokens=4)
    llm.generate([PROMPTS[3]], GREEDY)
    stats = llm.engine.stats

    class Source:
        snapshot = EngineSnapshot.take(llm.engine, ThroughputWindow(10.0))

    figures = ServerMetrics(Source).as_json()
    assert figures["spec_draft_tokens_total"] == stats.draft_tokens_total > 0
    assert figures["spec_accepted_tokens_total"] == stats.accepted_draft_tokens_total > 0
    registry = CollectorRegistry()
    registry.register(EngineGauges(Source, "tiny"))
    text = generate_latest(registry).decode()
    assert f'qwen_serve:spec_decode_num_draft_tokens_total{{model_name="tiny"}} {float(stats.draft_tokens_total)}' in text
    assert (f'qwen_serve:spec_decode_num_accepted_tokens_total{{model_name="tiny"}} '
            f'{float(stats.accepted_draft_tokens_total)}') in text
