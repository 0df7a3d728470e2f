"""The priority scheduling policy on the real scheduler and paged cache (block bookkeeping over
numpy storage; the "model" only advances positions): waiting requests in (priority, arrival)
order, lower-priority sequences preempted when a better one needs KV blocks, never for equal or
better ones, and greedy output unchanged by such preemptions on a real model."""
from __future__ import annotations

import itertools

import pytest
from numpy_kv_storage import NumpyKVStorage

from qwen_serve import LLM, SamplingParams
from qwen_serve.config import EngineConfig
from qwen_serve.engine.detokenizer import IncrementalDetokenizer
from qwen_serve.engine.scheduler import Scheduler
from qwen_serve.engine.sequence import Sequence, Status
from qwen_serve.kv.paged import PagedKVCache

BS = 4


def make_scheduler(policy: str, num_blocks: int, max_batch: int) -> Scheduler:
    cache = PagedKVCache(NumpyKVStorage(1, 1, 2, BS, slab_blocks=4, max_blocks=num_blocks), BS, num_blocks,
                         prefix_caching=False)
    config = EngineConfig(block_size=BS, kv_blocks=num_blocks, max_batch=max_batch, scheduling_policy=policy,
                          chunk_size=64, step_budget=64)
    return Scheduler(cache, config)


_ids = itertools.count()
_clock = itertools.count(1)


def make_seq(prompt_len: int, priority: int = 0, max_tokens: int = 64) -> Sequence:
    """Arrival times strictly increase in creation order."""
    i = next(_ids)
    return Sequence(seq_id=i, request_id=f"r{i}", prompt_token_ids=[7] * prompt_len,
                    params=SamplingParams(max_tokens=max_tokens), generator=None,
                    detokenizer=IncrementalDetokenizer(lambda ids: ""), arrival_time=float(next(_clock)),
                    priority=priority)


def step(scheduler: Scheduler) -> list[int]:
    """One step as the engine runs it, minus the model: positions advance, a sampled chunk
    adds one token. Returns the seq ids in the batch; every one of them must be running."""
    batch = scheduler.schedule()
    running = {s.seq_id: s for s in scheduler.running}
    assert all(c.seq_id in running for c in batch.chunks), "a chunk of a preempted sequence stayed in the batch"
    assert batch.num_tokens <= scheduler.config.step_budget
    for c in batch.chunks:
        seq = running[c.seq_id]
        assert c.start == seq.num_computed
        seq.num_computed += len(c.token_ids)
        if c.sample:
            seq.output_token_ids.append(1)
    return [c.seq_id for c in batch.chunks]


def first_token_order(scheduler: Scheduler, seqs: list[Sequence], steps: int = 200) -> list[str]:
    """Run until every seq has a token, finishing each as soon as it has one (so the batch frees)."""
    order: list[str] = []
    for _ in range(steps):
        step(scheduler)
        for seq in seqs:
            if seq.output_token_ids and seq.request_id not in order:
                order.append(seq.request_id)
                scheduler.finish(seq, "length")
        if len(order) == len(seqs):
            return order
    raise AssertionError(f"not all sequences got a token: {order}")


def test_waiting_requests_run_by_priority_then_arrival():
    scheduler = make_scheduler("priority", num_blocks=64, max_batch=1)
    seqs = [make_seq(6, priority=p) for p in (5, 5, 0, 5, -3, 0)]
    for seq in seqs:
        scheduler.add(seq)
    names = {s.request_id: (s.priority, i) for i, s in enumerate(seqs)}
    order = first_token_order(scheduler, seqs)
    assert [names[r] for r in order] == sorted(names.values()), order


def test_fcfs_ignores_nothing_and_keeps_arrival_order():
    scheduler = make_scheduler("fcfs", num_blocks=64, max_batch=1)
    seqs = [make_seq(6) for _ in range(5)]
    for seq in seqs:
        scheduler.add(seq)
    assert first_token_order(scheduler, seqs) == [s.request_id for s in seqs]


def test_a_later_high_priority_request_preempts_a_low_one_when_blocks_run_out():
    scheduler = make_scheduler("priority", num_blocks=8, max_batch=4)
    low = make_seq(24, priority=10)  # 6 of the 8 blocks
    scheduler.add(low)
    step(scheduler)
    assert low.status is Status.RUNNING
    high = make_seq(12, priority=1)  # 3 blocks: only fits if low goes
    scheduler.add(high)
    batch = step(scheduler)
    assert high.status is Status.RUNNING and high.seq_id in batch
    assert low.status is Status.WAITING and low.num_preemptions == 1 and low.seq_id not in batch
    assert scheduler.num_preemptions == 1
    usage = scheduler.cache.usage()
    assert usage.used == 3 and usage.used + usage.free == 8


@pytest.mark.parametrize("running_priority, waiting_priority", [(1, 1), (0, 5)], ids=["equal", "lower waits"])
def test_no_preemption_for_an_equal_or_lower_priority(running_priority, waiting_priority):
    scheduler = make_scheduler("priority", num_blocks=8, max_batch=4)
    running = make_seq(24, priority=running_priority)
    scheduler.add(running)
    step(scheduler)
    waiting = make_seq(12, priority=waiting_priority)
    scheduler.add(waiting)
    for _ in range(3):
        step(scheduler)
    assert running.status is Status.RUNNING and running.num_preemptions == 0
    assert waiting.status is Status.WAITING and scheduler.num_preemptions == 0


def test_decode_preempts_the_lowest_priority_and_drops_its_chunk():
    """In a full pool the first decode that needs a new block is a high-priority one; the victim
    must be the lowest-priority sequence, which runs first and was already given its decode."""
    scheduler = make_scheduler("priority", num_blocks=6, max_batch=3)
    low = make_seq(5, priority=9, max_tokens=8)  # 2 blocks, room for 3 more tokens
    scheduler.add(low)
    step(scheduler)
    mid, high = make_seq(7, priority=5, max_tokens=8), make_seq(8, priority=0, max_tokens=8)
    scheduler.add(mid)
    scheduler.add(high)
    step(scheduler)  # low decodes, mid and high prefill: 2 + 2 + 2 blocks, the pool is full
    assert scheduler.cache.usage().free == 0 and [s.seq_id for s in scheduler.running][0] == low.seq_id
    batch = step(scheduler)  # low's token fits its block; high's needs a third one
    assert high.seq_id in batch and low.seq_id not in batch
    assert low.status is Status.WAITING and low.num_preemptions == 1
    assert mid.status is Status.RUNNING and high.status is Status.RUNNING


def test_priority_preemption_leaves_greedy_output_unchanged(qwen3_tiny):
    """A real model: prompts with mixed priorities in a pool too small for all of them give the
    tokens they give one at a time, and every block comes back."""
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    reference = LLM(str(qwen3_tiny))
    prompts = [reference.tokenizer.encode(f"Item {i}: " + "lorem ipsum " * (3 + i)) for i in range(6)]
    alone = [reference.generate([p], params)[0].token_ids for p in prompts]
    llm = LLM(str(qwen3_tiny), kv_blocks=12, prefix_cache=False, scheduling_policy="priority")
    engine = llm.engine
    seqs = [engine.add_request(f"p{i}", p, params, priority=(5 - i)) for i, p in enumerate(prompts)]
    while any(not s.is_finished for s in seqs):
        engine.step()
    assert [s.output_token_ids for s in seqs] == alone
    assert engine.scheduler.num_preemptions > 0
    assert llm.parts.cache.usage().used == 0
