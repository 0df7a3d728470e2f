"""n > 1: the prompt is prefilled once and the choices fork its KV blocks with
copy-on-write; choice i of seed s equals a single request with seed s + i; every block comes back
after finishing or aborting; preemption and a cache that cannot fork change nothing."""
from __future__ import annotations

import asyncio

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.engine.async_engine import AsyncEngine
from qwen_serve.errors import InvalidRequest

SEEDED = dict(temperature=1.0, top_p=0.95, seed=42, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(qwen3_tiny):
    return str(qwen3_tiny)


@pytest.fixture(scope="module")
def prompt(tiny):
    tokens = LLM(tiny).tokenizer.encode("The choices share this prompt, which spans more than two blocks. " * 3)
    assert len(tokens) == 40  # two full blocks of 16 and a partly filled third
    return tokens


@pytest.fixture(scope="module")
def alone(tiny, prompt):
    """Choice i's expected tokens: a single request with seed 42 + i."""
    llm = LLM(tiny, prefix_cache=False)
    return [llm.generate([prompt], SamplingParams(**dict(SEEDED, seed=42 + i)))[0].token_ids for i in range(3)]


def test_three_choices_each_equal_a_single_request_and_the_prompt_is_prefilled_once(tiny, prompt, alone):
    llm = LLM(tiny, prefix_cache=False)
    outs = llm.generate([prompt], SamplingParams(**SEEDED, n=3))
    assert [o.index for o in outs] == [0, 1, 2]
    assert [o.token_ids for o in outs] == alone
    assert len({tuple(t) for t in alone}) == 3
    stats, usage = llm.engine.stats, llm.parts.cache.usage()
    assert stats.prefill_tokens_total == len(prompt)  # once, not three times
    assert stats.decode_tokens_total == 3 * (SEEDED["max_tokens"] - 1)
    assert usage.cow_copies == 2  # the prompt's last, partly filled block: copied by two of the three
    assert usage.used == 0 and llm.engine.sequences == {}


def test_generate_returns_n_outputs_per_prompt_in_order(tiny, prompt):
    llm = LLM(tiny)
    other = llm.tokenizer.encode("A second prompt.")
    outs = llm.generate([prompt, other], SamplingParams(**SEEDED, n=2))
    assert [(o.prompt_token_ids == prompt, o.index) for o in outs] == [(True, 0), (True, 1), (False, 0), (False, 1)]
    assert outs[0].request_id == outs[1].request_id != outs[2].request_id


def test_a_cache_without_forking_runs_independent_choices(tiny, prompt, alone):
    llm = LLM(tiny, kv_cache="naive")
    outs = llm.generate([prompt], SamplingParams(**SEEDED, n=3))
    assert [o.token_ids for o in outs] == alone
    assert llm.engine.stats.prefill_tokens_total == 3 * len(prompt)
    assert llm.parts.cache.usage().used == 0


def test_preemption_leaves_the_choices_unchanged(tiny, prompt, alone):
    # the three choices need 2 shared + 3 x 2 own blocks; beside another request's 3, 9 are too few
    other = LLM(tiny).tokenizer.encode("Another request competes for the same small pool of blocks.")
    other_params = SamplingParams(**dict(SEEDED, seed=7, max_tokens=24))
    other_alone = LLM(tiny, prefix_cache=False).generate([other], other_params)[0].token_ids
    llm = LLM(tiny, prefix_cache=False, kv_blocks=9)
    seqs = llm.engine.run([("choices", prompt, SamplingParams(**SEEDED, n=3)), ("other", other, other_params)])
    assert llm.engine.scheduler.num_preemptions > 0
    assert [s.output_token_ids for s in seqs] == alone + [other_alone]
    assert llm.parts.cache.usage().used == 0


def test_more_choices_than_the_batch_run_as_independent_sequences(tiny, prompt):
    llm = LLM(tiny, max_batch=2, step_budget=64)
    outs = llm.generate([prompt], SamplingParams(**SEEDED, n=3))
    single = LLM(tiny, prefix_cache=False)
    assert [o.token_ids for o in outs] == [single.generate([prompt], SamplingParams(**dict(SEEDED, seed=42 + i)))[0]
                                           .token_ids for i in range(3)]
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached


@pytest.mark.parametrize("steps", [1, 4], ids=["before the fork", "after the fork"])
def test_abort_frees_every_choice(tiny, prompt, steps):
    llm = LLM(tiny, prefix_cache=False, chunk_size=16)  # the prompt needs several steps to prefill
    engine = llm.engine
    engine.add_request("r", prompt, SamplingParams(**SEEDED, n=3))
    for _ in range(steps):
        engine.step()
    running = len(engine.scheduler.running)
    assert running == (1 if steps == 1 else 3)
    assert llm.parts.cache.usage().used > 0
    assert engine.abort("r")
    assert llm.parts.cache.usage().used == 0 and not engine.has_unfinished() and engine.sequences == {}


def test_prefix_cache_blocks_are_all_that_stay(tiny, prompt):
    llm = LLM(tiny)
    llm.generate([prompt], SamplingParams(**SEEDED, n=3))
    usage = llm.parts.cache.usage()
    assert usage.used == usage.cached == 2 + 3  # the prompt's two full blocks, and each choice's third
    assert llm.parts.cache.pool.num_allocatable == usage.total  # all of them evictable


def test_n_too_large_for_the_kv_pool_is_an_invalid_request(tiny, prompt):
    llm = LLM(tiny, kv_blocks=12)
    params = SamplingParams(**dict(SEEDED, max_tokens=64), n=3)  # 2 shared blocks + 3 x 5 > 12
    with pytest.raises(InvalidRequest, match=r"n = 3 choices .* need 17 KV blocks") as exc:
        llm.engine.check_request(prompt, params)
    assert exc.value.param == "n"
    llm.engine.check_request(prompt, SamplingParams(**dict(SEEDED, max_tokens=64), n=2))  # 12 blocks fit


def test_the_async_engine_streams_every_choice_then_ends(tiny, prompt, alone):
    llm = LLM(tiny, prefix_cache=False)
    engine = AsyncEngine(llm.engine)
    engine.start()

    async def collect():
        tokens = {0: [], 1: [], 2: []}
        finished = []
        async for out in engine.generate("req", prompt, SamplingParams(**SEEDED, n=3), arrival_time=0.0):
            tokens[out.index] += out.new_token_ids
            if out.finished:
                finished.append(out.index)
        return tokens, finished

    try:
        tokens, finished = asyncio.run(collect())
    finally:
        engine.shutdown()
    assert sorted(finished) == [0, 1, 2]
    assert [tokens[i] for i in range(3)] == alone
