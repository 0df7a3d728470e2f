"""Static batching (EngineConfig.batching="static"): a new batch is admitted only when the last
one has finished; continuous batching refills a slot the step after it frees. Same outputs."""
from __future__ import annotations

import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.config import EngineConfig

MAX_TOKENS = (3, 9, 5, 2, 7, 4)  # six requests, uneven lengths, batches of at most 4
FIRST = {"r0", "r1", "r2", "r3"}


def run_and_trace(tiny, batching: str):
    """Step the engine by hand. A 3-token prompt prefills in one step, so every running
    sequence yields one output per step: trace[i] is the set of requests that ran in step i."""
    llm = LLM(str(tiny), max_batch=4, batching=batching, prefix_cache=False)
    seqs = [llm.engine.add_request(f"r{i}", [100 + i, 200 + i, 300 + i], SamplingParams(max_tokens=n, ignore_eos=True))
            for i, n in enumerate(MAX_TOKENS)]
    trace, finished_at = [], {}
    while any(not s.is_finished for s in seqs):
        outputs = llm.engine.step()
        trace.append({out.request_id for out in outputs})
        finished_at.update({out.request_id: len(trace) - 1 for out in outputs if out.finished})
    return {s.request_id: s.output_token_ids for s in seqs}, trace, finished_at


@pytest.fixture(scope="module")
def traces(qwen3_tiny):
    return {mode: run_and_trace(qwen3_tiny, mode) for mode in ("static", "continuous")}


def started_at(trace, request_id):
    return min(i for i, ids in enumerate(trace) if request_id in ids)


def test_static_admits_the_next_batch_only_after_the_last_finished(traces):
    _, trace, finished_at = traces["static"]
    assert trace[0] == FIRST
    last_of_first = max(finished_at[r] for r in FIRST)  # r1, 9 tokens: step 8
    assert last_of_first == 8
    assert started_at(trace, "r4") == started_at(trace, "r5") == last_of_first + 1
    assert all(len(ids) <= 2 for ids in trace[last_of_first + 1:])


def test_continuous_refills_a_slot_the_step_after_it_frees(traces):
    _, trace, finished_at = traces["continuous"]
    first_free = min(finished_at[r] for r in FIRST)  # r3, 2 tokens: step 1
    assert first_free == 1
    assert started_at(trace, "r4") == first_free + 1
    assert len(trace) < len(traces["static"][1])  # 9 steps vs 16


def test_static_and_continuous_give_the_same_tokens(traces):
    static, continuous = traces["static"][0], traces["continuous"][0]
    assert static == continuous
    assert [len(static[f"r{i}"]) for i in range(6)] == list(MAX_TOKENS)


def test_unknown_batching_mode_is_an_error():
    with pytest.raises(ValueError, match="batching must be one of continuous, static"):
        EngineConfig(batching="dynamic")
