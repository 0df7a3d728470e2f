"""Bad requests: each gets its documented status and an OpenAI error body, never a 500, and
leaves nothing behind (no blocks, no queue entries)."""
from __future__ import annotations

import json
import threading
import time

import pytest
from server_process import own_server, parse_sse

MAX_SEQ_LEN = 256
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--max-seq-len", str(MAX_SEQ_LEN)])


def body(**fields) -> dict:
    return {"messages": HELLO, "max_tokens": 4, **fields}


def nonfinite(name: str, literal: str) -> bytes:
    """Python's json module (unlike the JSON spec) reads NaN and Infinity literals."""
    return b'{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "%s": %s}' % (
        name.encode(), literal.encode())


# (case id, method, path, body, expected status)
BAD_REQUESTS = [
    ("bad JSON", "POST", "/v1/chat/completions", b'{"messages": [', 400),
    ("body not UTF-8", "POST", "/v1/chat/completions", b'{"messages": "\xff"}', 400),
    ("JSON array body", "POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("empty body", "POST", "/v1/chat/completions", b"", 400),
    ("no messages", "POST", "/v1/chat/completions", {"max_tokens": 4}, 400),
    ("empty messages", "POST", "/v1/chat/completions", body(messages=[]), 400),
    ("messages as string", "POST", "/v1/chat/completions", body(messages="Hello"), 400),
    ("message not an object", "POST", "/v1/chat/completions", body(messages=["Hello"]), 400),
    ("message without role", "POST", "/v1/chat/completions", body(messages=[{"content": "Hello"}]), 400),
    ("unknown role", "POST", "/v1/chat/completions", body(messages=[{"role": "wizard", "content": "Hi"}]), 400),
    ("content as number", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": 5}]), 400),
    ("temperature as string", "POST", "/v1/chat/completions", body(temperature="0.5"), 400),
    ("max_tokens as bool", "POST", "/v1/chat/completions", body(max_tokens=True), 400),
    ("max_tokens as float", "POST", "/v1/chat/completions", body(max_tokens=2.5), 400),
    ("max_tokens as string", "POST", "/v1/chat/completions", body(max_tokens="4"), 400),
    ("negative max_tokens", "POST", "/v1/chat/completions", body(max_tokens=-1), 400),
    ("zero max_tokens", "POST", "/v1/chat/completions", body(max_tokens=0), 400),
    ("negative max_completion_tokens", "POST", "/v1/chat/completions", body(max_completion_tokens=-5), 400),
    ("temperature below 0", "POST", "/v1/chat/completions", body(temperature=-0.1), 400),
    ("temperature NaN", "POST", "/v1/chat/completions", nonfinite("temperature", "NaN"), 400),
    ("temperature Infinity", "POST", "/v1/chat/completions", nonfinite("temperature", "Infinity"), 400),
    ("top_p NaN", "POST", "/v1/chat/completions", nonfinite("top_p", "NaN"), 400),
    ("top_p 0", "POST", "/v1/chat/completions", body(top_p=0), 400),
    ("top_p above 1", "POST", "/v1/chat/completions", body(top_p=1.5), 400),
    ("top_p negative", "POST", "/v1/chat/completions", body(top_p=-0.5), 400),
    ("top_k negative", "POST", "/v1/chat/completions", body(top_k=-1), 400),
    ("seed as string", "POST", "/v1/chat/completions", body(seed="42"), 400),
    ("stream as string", "POST", "/v1/chat/completions", body(stream="yes"), 400),
    ("stop as number", "POST", "/v1/chat/completions", body(stop=7), 400),
    ("stop list with a number", "POST", "/v1/chat/completions", body(stop=["ok", 3]), 400),
    ("top_logprobs over 20", "POST", "/v1/chat/completions", body(logprobs=True, top_logprobs=21), 400),
    ("max_tokens over max_seq_len", "POST", "/v1/chat/completions", body(max_tokens=MAX_SEQ_LEN), 400),
    ("prompt over max_seq_len", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "word " * MAX_SEQ_LEN}], max_tokens=1), 400),
    ("unsupported n=2", "POST", "/v1/chat/completions", body(n=2), 400),
    ("priority under fcfs", "POST", "/v1/chat/completions", body(priority=1), 400),
    ("priority as string", "POST", "/v1/chat/completions", body(priority="high"), 400),
    ("priority as float", "POST", "/v1/chat/completions", body(priority=0.5), 400),
    ("unknown model", "POST", "/v1/chat/completions", body(model="gpt-4o"), 404),
    ("huge body", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "x" * (5 * 2**20)}]), 413),
    ("unknown route", "GET", "/v1/nothing-here", None, 404),
    ("unknown POST route", "POST", "/v1/completions-typo", body(), 404),
    ("GET on chat completions", "GET", "/v1/chat/completions", None, 405),
    ("POST on health", "POST", "/health", body(), 405),
    ("DELETE on metrics", "DELETE", "/metrics", None, 405),
]


def assert_openai_error(status: int, headers: dict, raw: bytes, expected_status: int) -> dict:
    assert status == expected_status, f"HTTP {status} (expected {expected_status}): {raw[:300]!r}"
    assert headers["content-type"].split(";")[0].strip() == "application/json", headers
    error = json.loads(raw)["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == "invalid_request_error", error
    assert "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("method, path, payload, expected", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_gets_documented_error(server, method, path, payload, expected):
    status, headers, raw = server.request(method, path, payload)
    assert_openai_error(status, headers, raw, expected)


@pytest.mark.parametrize("fields", [
    {"temperature": -1},
    {"max_tokens": MAX_SEQ_LEN},
    {"messages": []},
    {"n": 2},
], ids=["temperature", "too long", "no messages", "n"])
def test_bad_streaming_request_gets_json_not_sse(server, fields):
    status, headers, raw = server.request("POST", "/v1/chat/completions", body(stream=True, **fields))
    assert not raw.startswith(b"data:")
    assert_openai_error(status, headers, raw, 400)


@pytest.mark.parametrize("fields", [
    {"temperature": 2.0},
    {"temperature": 1.0, "top_p": 1e-9},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 1.0, "top_k": 10**12},
    {"max_completion_tokens": 3},
    {"stop": ["a"] * 16},
    {"logprobs": True, "top_logprobs": 20},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]},
    {"priority": 0},
], ids=["temperature 2", "top_p tiny", "top_k 1", "top_k huge", "max_completion_tokens",
        "16 stops", "top_logprobs 20", "content parts", "priority 0 under fcfs"])
def test_valid_edge_values_are_served(server, fields):
    status, _, raw = server.chat(body(**fields))
    assert status == 200, raw
    reply = json.loads(raw)
    assert reply["choices"][0]["finish_reason"] in ("stop", "length") and reply["usage"]["completion_tokens"] >= 1


def test_near_zero_temperature_samples_the_greedy_answer(server):
    status, _, greedy = server.chat(body(temperature=0, max_tokens=8))
    assert status == 200, greedy
    for temperature in (1e-6, 1e-30, 1e-300):
        status, _, raw = server.chat(body(temperature=temperature, seed=3, max_tokens=8))
        assert status == 200, f"temperature {temperature}: {raw[:200]!r}"
        assert json.loads(raw)["choices"][0]["message"] == json.loads(greedy)["choices"][0]["message"]


def test_a_bad_request_does_not_disturb_a_running_one(server):
    """A request that the engine cannot sample must fail alone (or, better, be refused up
    front), never take the other running requests down with it."""
    done: dict = {}
    max_tokens = 60
    before = server.wait_until_idle()
    runner = threading.Thread(target=lambda: done.update(
        reply=server.chat(body(stream=True, max_tokens=max_tokens, messages=[{"role": "user", "content": "Go on."}]))))
    runner.start()
    deadline = time.monotonic() + 20
    while not (m := server.metrics())["requests_active"] or m["decode_tokens_total"] == before["decode_tokens_total"]:
        assert time.monotonic() < deadline, "the long request never started decoding"
        time.sleep(0.02)
    statuses = [server.request("POST", "/v1/chat/completions", nonfinite("temperature", "NaN"))[0],
                server.chat(body(temperature=1e-300))[0]]
    runner.join(timeout=120)
    status, _, raw = done["reply"]
    payloads = parse_sse(raw)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not any("error" in c for c in chunks), f"the running stream was failed: {payloads[-2]}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
    assert all(s < 500 for s in statuses), statuses


def test_length_limit_is_exact(server):
    """prompt + max_tokens == max_seq_len is served; one token more is refused."""
    long_prompt = [{"role": "user", "content": "word " * (MAX_SEQ_LEN - 40)}]
    status, _, raw = server.chat(body(messages=long_prompt, max_tokens=1))
    assert status == 200, raw
    prompt_tokens = json.loads(raw)["usage"]["prompt_tokens"]
    assert prompt_tokens < MAX_SEQ_LEN
    status, _, raw = server.chat(body(messages=long_prompt, max_tokens=MAX_SEQ_LEN - prompt_tokens))
    assert status == 200, raw
    status, headers, raw = server.chat(body(messages=long_prompt, max_tokens=MAX_SEQ_LEN - prompt_tokens + 1))
    assert_openai_error(status, headers, raw, 400)


def test_wrong_method_names_the_allowed_one(server):
    status, headers, _ = server.request("GET", "/v1/chat/completions")
    assert status == 405 and "POST" in headers.get("allow", "")


def test_nothing_leaks_and_the_server_still_answers(server):
    statuses = {case: server.request(method, path, payload)[0]  # the whole table again, back to back
                for case, method, path, payload, _ in BAD_REQUESTS}
    m = server.wait_until_idle(timeout_s=5.0)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0 and m["queue_depth"] == 0
    server.assert_still_serving()
    assert not {case: s for case, s in statuses.items() if s >= 500}, "bad input answered with a server error"
