"""Serving under load, on one real server (tiny random Qwen3; --max-batch 2 --max-queue 4,
priority scheduling): 4x overload gets 429s with Retry-After and no 5xx while every admitted
request completes; a storm of clients that disconnect while queued, prefilling or decoding
leaks no KV block; a later high-priority request gets its first token before earlier low-priority
ones; the Prometheus exposition parses and carries vLLM's metric names.

Every model call sleeps a known delay (the test plugin's step-delay), which bounds how long an
admitted request runs from below: requests fired together arrive while the first ones still run.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import aiohttp
import openai
import pytest
from overload_server import MAX_BATCH, MAX_QUEUE
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import request_log
from sse_client import SSEClient
from stream_checks import StreamCollector

CLIENTS = 4 * (MAX_BATCH + MAX_QUEUE)
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds")
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits",
            "num_preemptions", "num_requests_rejected", "request_success")


@pytest.fixture(scope="module")
def server(overload_server):
    return overload_server


def messages(i: int, words: int = 4) -> list[dict]:
    return [{"role": "user", "content": f"client {i}: " + "tell me more " * words}]


def prometheus(server) -> dict[str, object]:
    status, headers, raw = server.request("GET", "/metrics/prometheus")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(raw.decode())}


def sample(families: dict, name: str, suffix: str = "", **labels: str) -> float:
    family = families["qwen_serve:" + name]
    values = [s.value for s in family.samples if s.name == family.name + suffix
              and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(values) <= 1, (name, labels, values)
    return values[0] if values else 0.0


# --- 4x overload -----------------------------------------------------------------------------

async def raw_client(session: aiohttp.ClientSession, url: str, i: int) -> dict:
    async with session.post(url + "/v1/chat/completions", json={"messages": messages(i), "max_tokens": 16}) as r:
        return {"kind": "raw", "status": r.status, "headers": {k.lower(): v for k, v in r.headers.items()}, "body": await r.json()}


async def openai_client(client: openai.AsyncOpenAI, model: str, i: int) -> dict:
    try:
        stream = await client.chat.completions.create(model=model, messages=messages(i), max_tokens=16, stream=True)
        collected = await StreamCollector().acollect(stream)
        return {"kind": "openai", "status": 200, "collected": collected}
    except openai.APIStatusError as exc:
        return {"kind": "openai", "status": exc.status_code, "headers": {k.lower(): v for k, v in exc.response.headers.items()},
                "body": exc.response.json()}


async def overload(server, model: str, samples: list[dict]) -> list[dict]:
    stop = asyncio.Event()

    async def poll_metrics(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with session.get(server.url + "/metrics", headers={"Accept": "application/json"}) as r:
                samples.append(await r.json())
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as session, openai.AsyncOpenAI(
            base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as client:
        poller = asyncio.ensure_future(poll_metrics(session))
        results = await asyncio.gather(*(raw_client(session, server.url, i) if i % 2 else openai_client(client, model, i)
                                         for i in range(CLIENTS)))
        stop.set()
        await poller
    return results


def test_four_times_overload_is_refused_with_429_and_nothing_else_fails(server, step_delay):
    model = json.loads(server.request("GET", "/v1/models")[2])["data"][0]["id"]
    step_delay(0.02)  # 16 tokens take >= 0.3 s
    before_rejected = sample(prometheus(server), "num_requests_rejected", "_total", reason="queue_full")
    samples: list[dict] = []
    results = asyncio.run(overload(server, model, samples))

    statuses = [r["status"] for r in results]
    assert not [s for s in statuses if s >= 500], statuses
    assert set(statuses) <= {200, 429}, statuses
    refused = [r for r in results if r["status"] == 429]
    served = [r for r in results if r["status"] == 200]
    assert refused, "4x overload was never refused"
    assert len(served) >= MAX_BATCH + MAX_QUEUE, statuses  # the first arrivals all fit
    for r in refused:
        assert int(r["headers"]["retry-after"]) >= 1, r["headers"]
        assert r["body"]["error"]["code"] == "queue_full" and r["body"]["error"]["message"]
    for r in served:
        if r["kind"] == "raw":
            assert r["body"]["choices"][0]["finish_reason"] == "length" and r["body"]["usage"]["completion_tokens"] == 16
        else:
            assert r["collected"].finish_reason == "length" and r["collected"].usage.completion_tokens == 16
    assert all(m["requests_active"] <= MAX_BATCH + MAX_QUEUE and m["queue_depth"] <= MAX_QUEUE for m in samples), \
        max(samples, key=lambda m: m["requests_active"])
    after = server.wait_until_idle()
    assert after["kv_blocks_used"] == after["kv_blocks_cached"]
    rejected = sample(prometheus(server), "num_requests_rejected", "_total", reason="queue_full") - before_rejected
    assert rejected == len(refused)


# --- disconnect storm ------------------------------------------------------------------------

async def storm_client(server, rng: random.Random, prefill: bool = False) -> None:
    """Sends a request and hangs up: before any answer after a random delay, or after a random
    number of stream events. Prompts are new (no prefix-cache hit shortens a prefill). With
    prefill, a long prompt sent to an idle batch and a hang-up within its prefill (>= 13 steps
    of >= 0.04 s)."""
    body = json.dumps({"messages": messages(rng.getrandbits(64), words=60 if prefill else rng.choice([2, 60])),
                       "max_tokens": 40, "stream": prefill or rng.random() < 0.7}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    try:
        if prefill:
            await asyncio.sleep(rng.uniform(0.1, 0.4))
        elif rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0.0, 1.5))
        else:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            events = rng.randint(1, 8) if b"text/event-stream" in head else 0  # else a JSON answer (429, ...)
            while events and (line := await asyncio.wait_for(reader.readline(), 60)):
                events -= line.startswith(b"data: ")
    finally:
        writer.transport.abort()  # a hard close, as a client that dies does


def aborted_phases(server, ids_before: set) -> dict[str, int]:
    phases = {"queued": 0, "prefill": 0, "decode": 0}
    for request_id, entry in request_log(server).items():
        if request_id in ids_before or entry["finish_reason"] != "abort":
            continue
        phase = "queued" if entry["queue_s"] is None else "prefill" if entry["ttft_s"] is None else "decode"
        phases[phase] += 1
    return phases


def test_disconnect_storm_leaks_no_block(server, step_delay):
    """Long prompts prefill 16 tokens a step at >= 0.04 s a step: hang-ups land in each phase."""
    step_delay(0.04)
    ids_before = set(request_log(server))
    rng = random.Random(12)

    async def storm() -> None:
        """Clients that hang up in prefill take the idle batch; then a few more than fit
        arrive (some get 429s, some queue)."""
        prefills = [asyncio.ensure_future(storm_client(server, rng, prefill=True)) for _ in range(MAX_BATCH)]
        await asyncio.sleep(0.05)
        await asyncio.gather(*prefills, *(storm_client(server, rng) for _ in range(MAX_BATCH + MAX_QUEUE + 2)))

    for wave in range(1, 13):  # dozens of clients, until some hung up in each phase
        asyncio.run(storm())
        server.wait_until_idle(timeout_s=30)
        phases = aborted_phases(server, ids_before)
        if wave >= 4 and min(phases.values()) >= 2:
            break
    assert all(phases.values()), f"no client hung up in some phase: {phases}"
    print(f"\n{wave} waves of clients; requests aborted by hung-up clients, by phase: {phases}")
    m = server.wait_until_idle()
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0
    step_delay(None)
    server.assert_still_serving()


# --- priorities --------------------------------------------------------------------------------

def test_a_later_high_priority_request_gets_its_first_token_before_earlier_low_ones(server, step_delay):
    """Two low-priority requests run (one of 30 tokens, one of 60), two more wait; then a
    high-priority one arrives. It takes the first slot that frees, ahead of the waiting two."""
    model = json.loads(server.request("GET", "/v1/models")[2])["data"][0]["id"]
    step_delay(0.05)
    low = dict(priority=10)
    running = [SSEClient(server, {"messages": messages(0), "max_tokens": n, **low}) for n in (30, 60)]
    wait_for_metrics(server, lambda m: m["requests_active"] == 2 and m["queue_depth"] == 0)
    waiting = [SSEClient(server, {"messages": messages(i), "max_tokens": 4, **low}) for i in (1, 2)]
    wait_for_metrics(server, lambda m: m["queue_depth"] == 2)
    high: dict = {}

    def high_priority() -> None:
        with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as client:
            for chunk in client.chat.completions.create(model=model, messages=messages(3), max_tokens=4, stream=True,
                                                        extra_body={"priority": 0}):
                if chunk.choices[0].delta.content and "first" not in high:
                    high["first"] = time.monotonic()
                high["finish"] = chunk.choices[0].finish_reason or high.get("finish")

    thread = threading.Thread(target=high_priority)
    thread.start()
    thread.join(timeout=120)
    for stream in running + waiting:
        stream.wait()
    firsts = [next(t for t, line in s.events if '"content"' in line) for s in waiting]
    assert high["finish"] == "length"
    assert high["first"] < min(firsts), (f"high-priority first token {high['first']:.3f}, "
                                         f"waiting low-priority ones {[round(t, 3) for t in firsts]}")
    log = request_log(server)
    assert all(log[s.payloads[0]["id"]]["priority"] == 10 for s in running + waiting)
    server.wait_until_idle()


def wait_for_metrics(server, condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition(m := server.metrics()):
        assert time.monotonic() < deadline, m
        time.sleep(0.01)


# --- Prometheus ------------------------------------------------------------------------------------

def test_prometheus_exposition_parses_with_vllm_names(server):
    before = prometheus(server)
    status, _, raw = server.chat({"messages": messages(99), "max_tokens": 5})
    assert status == 200
    usage = json.loads(raw)["usage"]
    server.wait_until_idle()
    families = prometheus(server)
    for name, kind in [*((n, "histogram") for n in HISTOGRAMS), *((n, "gauge") for n in GAUGES),
                       *((n, "counter") for n in COUNTERS)]:
        assert families["qwen_serve:" + name].type == kind, (name, families.get("qwen_serve:" + name))
    for name in HISTOGRAMS:
        buckets = [s for s in families["qwen_serve:" + name].samples if s.name.endswith("_bucket")]
        assert buckets and all(s.labels["model_name"] for s in buckets)

    def delta(name: str, suffix: str = "_total", **labels: str) -> float:
        return sample(families, name, suffix, **labels) - sample(before, name, suffix, **labels)

    assert delta("prompt_tokens") == delta("prefix_cache_queries") == usage["prompt_tokens"]
    assert delta("generation_tokens") == usage["completion_tokens"] == 5
    assert delta("time_to_first_token_seconds", "_count") == delta("e2e_request_latency_seconds", "_count") == 1
    assert delta("inter_token_latency_seconds", "_count") == 4
    assert delta("request_success", "_total", finished_reason="length") == 1
    assert 0 <= sample(families, "kv_cache_usage_perc") <= 1
    assert sample(families, "num_requests_running") == sample(families, "num_requests_waiting") == 0
    status, headers, raw = server.request("GET", "/metrics", headers={"Accept": "text/plain"})
    assert status == 200 and "qwen_serve:time_to_first_token_seconds_bucket" in raw.decode()
