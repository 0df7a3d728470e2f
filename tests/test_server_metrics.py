"""GET /metrics: every documented field, its invariants, counters that follow the requests, TTFT
that includes queueing, and a Prometheus exposition with the same figures."""
from __future__ import annotations

import json
import math
import threading
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import own_server

KV_BLOCKS = 96
DOCUMENTED_FIELDS = ("uptime_s", "requests_total", "requests_active", "queue_depth", "ttft_ms", "tpot_ms",
               "tokens_per_sec", "kv_blocks_total", "kv_blocks_used", "kv_blocks_cached", "prefix_cache_hits",
               "prefill_tokens_total", "decode_tokens_total")
COUNTERS = ("requests_total", "prefix_cache_hits", "prefill_tokens_total", "decode_tokens_total")


@pytest.fixture(scope="module")
def server(qwen3_tiny):
    """One running sequence at a time, so a second request has to queue."""
    yield from own_server(["--model", str(qwen3_tiny), "--max-batch", "1", "--kv-blocks", str(KV_BLOCKS)])


def fresh_prompt(words: str = "") -> list[dict]:
    """A prompt no earlier request shares a full block with."""
    return [{"role": "user", "content": f"{uuid.uuid4().hex} {words}"}]


def check_invariants(m: dict) -> None:
    assert 0 <= m["kv_blocks_cached"] <= m["kv_blocks_used"] <= m["kv_blocks_total"] == KV_BLOCKS, m
    assert 0 <= m["queue_depth"] <= m["requests_active"], m
    assert m["uptime_s"] >= 0 and m["tokens_per_sec"] >= 0, m
    for name in ("ttft_ms", "tpot_ms"):
        assert 0 <= m[name]["p50"] <= m[name]["p95"], m


def test_ttft_includes_time_spent_queued(server):
    """With --max-batch 1 a request sent while another generates waits for it to finish; its
    TTFT (from request parse) must include that wait. Ratios are loose: only ordering and
    rough size are asserted, never speed."""
    server.wait_until_idle()
    times: dict[str, float] = {}
    replies: dict[str, tuple] = {}

    def long_request() -> None:
        replies["long"] = server.chat({"messages": [{"role": "user", "content": "Count forever."}], "max_tokens": 80})
        times["long_done"] = time.monotonic()

    def queued_request() -> None:
        conn = server.connection()
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": fresh_prompt(), "max_tokens": 2, "stream": True}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        while b'"content"' not in (line := response.readline()):
            assert line, "stream ended without content"
        times["queued_first_token"] = time.monotonic()
        response.read()
        conn.close()

    long_thread = threading.Thread(target=long_request)
    long_thread.start()
    seen = []
    deadline = time.monotonic() + 30
    while (m := server.metrics())["requests_active"] == 0:
        assert time.monotonic() < deadline, "the long request never became active"
        seen.append(m)
        time.sleep(0.01)
    queued_thread = threading.Thread(target=queued_request)
    times["queued_sent"] = time.monotonic()
    queued_thread.start()
    while long_thread.is_alive():
        seen.append(server.metrics())
        time.sleep(0.05)
    queued_thread.join(timeout=60)
    for m in seen:
        check_invariants(m)
    assert any(m["queue_depth"] == 1 and m["requests_active"] == 2 for m in seen), \
        "never saw the second request waiting"
    assert replies["long"][0] == 200 and json.loads(replies["long"][2])["usage"]["completion_tokens"] == 80

    waited_s = times["long_done"] - times["queued_sent"]
    client_ttft_s = times["queued_first_token"] - times["queued_sent"]
    assert client_ttft_s >= 0.8 * waited_s, "the queued request started before the running one finished"
    m = server.wait_until_idle()
    print(f"queued {waited_s * 1000:.0f} ms; client TTFT {client_ttft_s * 1000:.0f} ms; metrics ttft_ms {m['ttft_ms']}")
    # the samples: the queued request's long TTFT and short ones (at least the long request's);
    # p95 of fewer than 20 samples is (close to) the largest, and the median is below it
    assert m["ttft_ms"]["p95"] >= 0.5 * waited_s * 1000
    assert m["ttft_ms"]["p50"] < m["ttft_ms"]["p95"], f"the median is the outlier: {m['ttft_ms']}"


def test_every_spec_field_with_sane_values(server):
    m = server.metrics()
    assert set(DOCUMENTED_FIELDS) <= set(m), f"missing: {set(DOCUMENTED_FIELDS) - set(m)}"
    for name in DOCUMENTED_FIELDS:
        if name in ("ttft_ms", "tpot_ms"):
            assert set(m[name]) >= {"p50", "p95"} and all(isinstance(v, (int, float)) for v in m[name].values())
        else:
            assert isinstance(m[name], (int, float)) and not isinstance(m[name], bool), (name, m[name])
    for name in COUNTERS + ("requests_active", "queue_depth", "kv_blocks_total", "kv_blocks_used", "kv_blocks_cached"):
        assert isinstance(m[name], int), (name, m[name])
    check_invariants(m)
    health = json.loads(server.request("GET", "/health")[2])
    assert health["kv_blocks_total"] == m["kv_blocks_total"] == KV_BLOCKS
    time.sleep(0.05)
    assert server.metrics()["uptime_s"] > m["uptime_s"]


def test_counters_follow_a_request(server):
    before = server.wait_until_idle()
    status, _, raw = server.chat({"messages": fresh_prompt(), "max_tokens": 9})
    assert status == 200, raw
    usage = json.loads(raw)["usage"]
    after = server.wait_until_idle()
    assert after["requests_total"] == before["requests_total"] + 1
    assert after["prefix_cache_hits"] == before["prefix_cache_hits"]
    assert after["prefill_tokens_total"] - before["prefill_tokens_total"] == usage["prompt_tokens"]
    # the last sampled token is never fed back, so a decode step counts n - 1 or n tokens
    decoded = after["decode_tokens_total"] - before["decode_tokens_total"]
    assert usage["completion_tokens"] - 1 <= decoded <= usage["completion_tokens"], (decoded, usage)
    assert after["tokens_per_sec"] > 0  # 10 s window
    assert after["tpot_ms"]["p95"] > 0
    check_invariants(after)


def test_prefix_cache_hits_skip_prefill(server):
    system = {"role": "system", "content": " ".join(f"rule {i}: be precise." for i in range(30))}
    shared = fresh_prompt()[0]["content"]
    first = server.chat({"messages": [system, {"role": "user", "content": f"{shared} one"}], "max_tokens": 2})
    mid = server.wait_until_idle()
    second = server.chat({"messages": [system, {"role": "user", "content": f"{shared} two"}], "max_tokens": 2})
    after = server.wait_until_idle()
    assert first[0] == second[0] == 200
    prompt_tokens = json.loads(second[2])["usage"]["prompt_tokens"]
    hit_blocks = after["prefix_cache_hits"] - mid["prefix_cache_hits"]
    assert hit_blocks >= (prompt_tokens - 20) // 16 - 1, (hit_blocks, prompt_tokens)  # the system prompt's blocks
    assert after["prefill_tokens_total"] - mid["prefill_tokens_total"] == prompt_tokens - 16 * hit_blocks


def test_metrics_are_current_when_a_reply_arrives(server):
    """A client that has its reply reads /metrics at once: its request is no longer active and
    its tokens are counted (the engine must publish figures before handing out outputs)."""
    for _ in range(20):  # a race: on a busy machine a few tries expose it
        before = server.wait_until_idle()
        status, _, raw = server.chat({"messages": fresh_prompt(), "max_tokens": 1})
        m = server.metrics()
        assert status == 200, raw
        prompt_tokens = json.loads(raw)["usage"]["prompt_tokens"]
        assert (m["requests_active"], m["prefill_tokens_total"] - before["prefill_tokens_total"]) == (0, prompt_tokens), m


def prometheus_samples(text: str) -> tuple[dict[tuple[str, tuple], float], dict[str, str]]:
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def prometheus_value(samples: dict, field: str, labels: tuple = ()) -> float:
    names = {n for n, _ in samples}
    candidates = [n for n in names if n in (field, f"{field}_total") or n.endswith((f"_{field}", f"_{field}_total"))]
    candidates = [n for n in candidates if (n, labels) in samples]
    assert len(candidates) == 1, f"{field}{dict(labels)}: found {candidates} among {sorted(names)}"
    return samples[(candidates[0], labels)]


@pytest.mark.parametrize("path, headers", [
    ("/metrics/prometheus", {}),
    ("/metrics", {"Accept": "text/plain"}),
])
def test_prometheus_text_parses_and_matches_the_json(server, path, headers):
    server.chat({"messages": fresh_prompt(), "max_tokens": 3})
    figures = server.wait_until_idle()
    status, response_headers, raw = server.request("GET", path, headers=headers)
    assert status == 200
    assert response_headers["content-type"].startswith("text/plain")
    samples, types = prometheus_samples(raw.decode())
    for field in DOCUMENTED_FIELDS:
        if field in ("ttft_ms", "tpot_ms"):
            for quantile, key in (("0.5", "p50"), ("0.95", "p95")):
                assert prometheus_value(samples, field, (("quantile", quantile),)) == pytest.approx(figures[field][key])
        elif field not in ("uptime_s", "tokens_per_sec"):  # these move between the two reads
            assert prometheus_value(samples, field) == figures[field], field
        else:
            assert math.isfinite(prometheus_value(samples, field))
    counter_families = {name for name, kind in types.items() if kind == "counter"}
    for field in COUNTERS:
        assert any(field.removesuffix("_total") in name for name in counter_families), f"{field} is not a counter"
