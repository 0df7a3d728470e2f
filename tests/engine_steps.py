"""Stepping an engine under test: block accounting after every step, aborts at given steps
(shared by the block-accounting and speculation state-machine tests)."""
from __future__ import annotations

from typing import Any, Callable


def assert_blocks_accounted(cache: Any) -> None:
    """Each block's ref count equals the block tables holding it; used + free == total."""
    holders = [0] * cache.pool.num_blocks
    for seq_id in cache.sequence_ids():
        for block in cache.block_table(seq_id):
            holders[block] += 1
    assert holders == cache.pool.ref_cnt
    usage = cache.usage()
    assert usage.used + usage.free == usage.total


def step_until_done(engine: Any, aborts: dict[int, list[str]], after_step: Callable[[], None],
                    max_steps: int = 500) -> int:
    """Step until nothing is unfinished, aborting aborts[k]'s requests before step k; calls
    after_step after every step. Returns the steps taken."""
    steps = 0
    while engine.has_unfinished():
        for request_id in aborts.pop(steps, []):
            engine.abort(request_id)
        engine.step()
        steps += 1
        assert steps < max_steps
        after_step()
    return steps
