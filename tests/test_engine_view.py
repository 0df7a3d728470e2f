"""The engine view behind /engine: block states drawn by each cache that can describe its pool,
each request's phase as the scheduler has it, views taken only while someone watches, and the
event stream's gates (key, watcher cap). The page itself is driven in a browser by test_page.py."""
from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from numpy_kv_storage import NumpyKVStorage
from server_fixtures import own_server

from qwen_serve import LLM, SamplingParams
from qwen_serve.engine.async_engine import AsyncEngine
from qwen_serve.engine.view import EngineView, run_lengths
from qwen_serve.kv.hybrid import with_recurrent_state
from qwen_serve.kv.naive import NaiveKVCache
from qwen_serve.kv.paged import PagedKVCache
from qwen_serve.plugins.sliding_window.cache import SlidingWindowKVCache
from qwen_serve.protocols import BlockMap, DescribesBlocks
from qwen_serve.server.engine_stream import MAX_WATCHERS


def test_run_lengths_spell_every_block_once():
    states = "uuu..c" + "." * 300 + "s"
    runs = run_lengths(states)
    assert runs == "u3.2c1.300s1"
    assert "".join(letter * int(count) for letter, count in re.findall(r"(\D)(\d+)", runs)) == states


def test_the_paged_pool_tells_free_in_use_shared_copied_and_cached_blocks():
    cache = PagedKVCache(NumpyKVStorage(block_size=4), block_size=4, num_blocks=8)
    prompt = list(range(10))
    assert cache.allocate_slots(1, 0, 10)  # blocks 0, 1, 2 (two full, one partial)
    cache.publish(1, prompt, 10)
    assert cache.describe_blocks() == BlockMap("uuu.....", {})
    cache.fork(1, 2)
    assert cache.describe_blocks() == BlockMap("sss.....", {0: 2, 1: 2, 2: 2})
    assert cache.allocate_slots(2, 10, 1)  # child writes into the shared partial block: copy-on-write
    assert cache.describe_blocks() == BlockMap("ssuw....", {0: 2, 1: 2})
    cache.free(2)
    cache.free(1)
    assert cache.describe_blocks() == BlockMap("cc......", {})  # the published blocks stay findable
    assert cache.allocate_slots(3, 0, 4 * 8)  # the pool full again: the cached blocks are evicted
    assert cache.describe_blocks().states == "u" * 8


def test_a_copy_that_is_freed_and_reused_is_no_longer_marked_copied():
    cache = PagedKVCache(NumpyKVStorage(block_size=4), block_size=4, num_blocks=4)
    assert cache.allocate_slots(1, 0, 2)
    cache.fork(1, 2)
    assert cache.allocate_slots(2, 2, 1)
    assert cache.describe_blocks().states == "uw.."
    cache.free(2)
    assert cache.allocate_slots(3, 0, 4)
    assert cache.describe_blocks().states == "uu.."


def test_every_cache_kind_describes_its_blocks():
    naive = NaiveKVCache(NumpyKVStorage(block_size=4), block_size=4, num_blocks=8)
    assert naive.allocate_slots(1, 0, 3, expected_total=12)  # reserves 3 blocks up front
    assert naive.describe_blocks().states == "uuu....."
    window = SlidingWindowKVCache(NumpyKVStorage(block_size=4), block_size=4, num_blocks=8, window=4, chunk_size=4)
    assert window.allocate_slots(1, 0, 4)
    assert window.describe_blocks().states == "u......."
    paged = PagedKVCache(NumpyKVStorage(block_size=4), block_size=4, num_blocks=8)
    hybrid = with_recurrent_state(paged, state_storage=None, live_slots=2)
    assert isinstance(hybrid, DescribesBlocks) and hybrid.describe_blocks() == paged.describe_blocks()


class Opaque:
    """A cache that cannot describe its blocks: the view still shows its requests."""

    def __init__(self, inner: PagedKVCache) -> None:
        self.inner = inner
        self.block_size = inner.block_size

    def __getattr__(self, name):
        if name == "describe_blocks":
            raise AttributeError(name)
        return getattr(self.inner, name)


def view_of(engine) -> EngineView:
    from qwen_serve.engine.stats import EngineSnapshot, ThroughputWindow
    from qwen_serve.engine.view import EngineHistory

    return EngineView.take(engine, EngineSnapshot.take(engine, ThroughputWindow(1.0)), EngineHistory())


def test_each_request_shows_its_phase(qwen3_tiny):
    engine = LLM(str(qwen3_tiny), max_batch=1, chunk_size=16, kv_blocks=64).engine
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request("long", list(range(1, 41)), params)  # 40 tokens: chunks of 16, 16, 8
    engine.add_request("next", list(range(50, 60)), params)
    phases = []
    while engine.has_unfinished():
        view = view_of(engine)
        phases.append(tuple((r.request_id, r.phase, r.chunk, r.chunks, len(r.blocks)) for r in view.requests))
        engine.step()
    assert phases[0] == (("long", "queued", 0, 0, 0), ("next", "queued", 0, 0, 0))
    assert ("long", "prefill", 2, 3, 3) in phases[1]  # after its first chunk (its whole prompt reserved)
    assert ("long", "prefill", 3, 3, 3) in phases[2]
    assert phases[3][0][:2] == ("long", "decode") and phases[3][1][:2] == ("next", "queued")
    assert any(p and p[0][:2] == ("next", "decode") for p in phases)
    assert view_of(engine).blocks.states.count(BlockMap.IN_USE) == 0


def test_a_preempted_request_shows_as_preempted(qwen3_tiny):
    engine = LLM(str(qwen3_tiny), max_batch=2, kv_blocks=4, block_size=4, prefix_cache=False).engine
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    engine.add_request("a", list(range(1, 6)), params)  # 5 + 7 = 12 tokens: 3 blocks each at the end
    engine.add_request("b", list(range(10, 15)), params)
    seen = set()
    while engine.has_unfinished():
        engine.step()
        seen |= {(r.request_id, r.phase) for r in view_of(engine).requests}
    assert engine.scheduler.num_preemptions >= 1
    assert {r for r, phase in seen if phase == "preempted"}, seen


def test_views_are_taken_only_while_watched(qwen3_tiny):
    engine = AsyncEngine(LLM(str(qwen3_tiny)).engine)
    engine.start()

    async def run(request_id: str) -> None:
        async for _ in engine.generate(request_id, [1, 2, 3, 4], SamplingParams(max_tokens=8, ignore_eos=True),
                                       arrival_time=time.monotonic()):
            pass

    try:
        asyncio.run(run("unwatched"))
        time.sleep(0.2)
        assert engine.view is None  # nobody watched: the engine thread took none
        with engine.watch():
            deadline = time.monotonic() + 5
            while engine.view is None and time.monotonic() < deadline:
                time.sleep(0.01)  # an idle engine takes one as soon as someone watches
            assert engine.view is not None and engine.view.requests == ()
            assert engine.view.history and sum(tokens for _, tokens, _ in engine.view.history) == 8
        assert engine.view is None
    finally:
        engine.shutdown()


def test_a_cache_that_cannot_describe_still_shows_its_requests(qwen3_tiny):
    engine = LLM(str(qwen3_tiny)).engine
    engine.cache = Opaque(engine.cache)
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    view = view_of(engine)
    assert view.blocks is None and view.as_json()["blocks"] is None and len(view.requests) == 1


def read_frames(server, count: int, headers: dict[str, str] | None = None, timeout_s: float = 20.0) -> list[dict]:
    conn = server.connection(timeout=timeout_s)
    conn.request("GET", "/engine/stream", headers=headers or {})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    frames = []
    while len(frames) < count:
        line = response.readline()
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            frames.append(json.loads(line[6:]))
    conn.close()
    return frames


@pytest.fixture(scope="module")
def public_metrics_server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--kv-blocks", "32", "--api-key", "k",
                           "--metrics-public"])


def test_the_stream_is_open_with_public_metrics_and_caps_its_watchers(public_metrics_server):
    server = public_metrics_server
    (frame,) = read_frames(server, 1)
    assert frame["blocks"] == {"total": 32, "runs": ".32", "shared_refs": {}}
    assert frame["cache"] == "PagedKVCache" and frame["requests"] == []
    status, _, _ = server.request("GET", "/v1/models")
    assert status == 401  # the API itself still needs the key
    held = []
    for _ in range(MAX_WATCHERS):
        conn = server.connection()
        conn.request("GET", "/engine/stream")
        assert conn.getresponse().status == 200
        held.append(conn)
    status, _, body = server.request("GET", "/engine/stream")
    assert status == 429 and b"too_many_watchers" in body
    for conn in held:
        conn.close()
    deadline = time.monotonic() + 10
    while True:  # a closed stream frees its place
        conn = server.connection(timeout=10)
        conn.request("GET", "/engine/stream")
        status = conn.getresponse().status
        conn.close()
        if status == 200:
            break
        assert status == 429 and time.monotonic() < deadline
        time.sleep(0.2)
