"""The server's life on a real process: the port answers 503 "loading" until the model has
loaded and warmed up; SSE keep-alive comments while a request waits or prefills; --queue-timeout;
an engine thread that dies fails every open request and /health says "dead"; SIGTERM drains
in-flight streams to their end, aborts what outlives --shutdown-timeout, and exits 0.

The engine is steered through a test-only plugin (tests/server_plugins/controlled_engine.py):
files in a control directory hold the model load, slow every model call down by a known delay
(which bounds request durations from below, never from above) or make the KV cache raise a
FatalEngineError. No server code is patched.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import openai
import pytest
from server_fixtures import controlled_env, request_log, set_step_delay
from sse_client import KEEPALIVE, SSEClient
from stream_checks import StreamCollector

from qwen_serve.conformance.server_process import ServerProcess

QUEUE_TIMEOUT_S = 3
KEEPALIVE_S = 0.2


def controlled_server(model: Path, control: Path, *args: str) -> ServerProcess:
    return ServerProcess(["--model", str(model), "--backend", "controlled", "--kv-cache", "controlled", *args],
                         env=controlled_env(control))


def chat_body(content: str = "Count forever.", max_tokens: int = 8, **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **fields}


def wait_metrics(server: ServerProcess, condition, what: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not condition(m := server.metrics()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {m}"
        time.sleep(0.02)
    return m


def in_thread(fn):
    """Run fn() on a thread; the returned dict gets "result" (or "error")."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def joined(out: dict, timeout_s: float = 120.0):
    out["thread"].join(timeout_s)
    assert not out["thread"].is_alive(), "the request did not finish"
    if "error" in out:
        raise out["error"]
    return out["result"]


def error_of(raw: bytes) -> dict:
    return json.loads(raw)["error"]


# --- one server: loading, keep-alive, queue timeout, then the engine's death -----------------

@pytest.fixture(scope="module")
def control(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("control")
    (directory / "hold-load").touch()  # the server starts "loading" and stays so until the test lets it go
    return directory


@pytest.fixture(scope="module")
def server(qwen3_tiny, control):
    proc = controlled_server(qwen3_tiny, control, "--max-batch", "1", "--queue-timeout", str(QUEUE_TIMEOUT_S),
                             "--sse-keepalive", str(KEEPALIVE_S), "--log-requests")
    proc.start(ready=False)
    try:
        yield proc
    finally:
        proc.stop(exited=True)  # the last test of this module makes it exit


def test_health_is_503_loading_until_the_model_is_ready(server, control):
    for _ in range(3):  # the load is held: the answer cannot change
        status, headers, raw = server.request("GET", "/health")
        assert status == 503 and json.loads(raw) == {"status": "loading"}, raw
        time.sleep(0.1)
    for method, path, body in (("POST", "/v1/chat/completions", chat_body()), ("GET", "/v1/models", None),
                               ("GET", "/metrics", None)):
        status, headers, raw = server.request(method, path, body)
        assert status == 503 and error_of(raw)["code"] == "loading", (path, raw)
        assert int(headers["retry-after"]) >= 1
    assert server.request("GET", "/openapi.json")[0] == 200
    assert "serving" not in server.output()

    (control / "hold-load").unlink()
    deadline = time.monotonic() + 60
    while (status := server.request("GET", "/health")[0]) != 200:
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.05)
    assert f"on http://127.0.0.1:{server.port}" in server.output()
    server.assert_still_serving()


def test_keepalive_comments_while_a_request_prefills_and_between_slow_tokens(server, control):
    """Every model call takes >= 0.5 s, more than twice the 0.2 s keep-alive interval: the
    stream opens with the role chunk and a comment during prefill, and clients ignore them."""
    set_step_delay(control, 0.5)
    try:
        raw = SSEClient(server, chat_body(max_tokens=3)).wait()
        assert raw.status == 200
        lines = [line for _, line in raw.events]
        first_content = next(i for i, line in enumerate(lines) if '"content"' in line)
        assert lines[0].startswith("data: ") and json.loads(lines[0][6:])["choices"][0]["delta"] == {"role": "assistant"}
        assert KEEPALIVE in lines[1:first_content], "no keep-alive while the prompt was prefilled"
        assert lines[-1] == "data: [DONE]" and raw.payloads[-2]["choices"][0]["finish_reason"] == "length"

        with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60) as client:
            collected = StreamCollector().collect(client.chat.completions.create(
                model=client.models.list().data[0].id, messages=chat_body()["messages"], max_tokens=3, stream=True))
        assert collected.finish_reason == "length" and collected.usage.completion_tokens == 3
        assert collected.text == "".join(p["choices"][0]["delta"].get("content") or "" for p in raw.payloads[:-1])
    finally:
        set_step_delay(control, None)
    server.wait_until_idle()


def test_queue_timeout_fails_requests_that_were_never_scheduled(server, control):
    """--max-batch 1: while a request of >= 4 s runs, others wait; after 3 s a waiting non-stream
    request gets 503 + Retry-After, and a waiting stream (opened by its keep-alives) an error
    event. The running request completes; the request log has one line each."""
    baseline = server.wait_until_idle()
    set_step_delay(control, 0.1)
    try:
        running = in_thread(lambda: server.chat(chat_body(max_tokens=40)))
        wait_metrics(server, lambda m: m["requests_active"] == 1 and m["queue_depth"] == 0, "the long request to run")
        stream = SSEClient(server, chat_body(max_tokens=4))
        waiting = in_thread(lambda: server.chat(chat_body(max_tokens=4)))
        status, headers, raw = joined(waiting)
        assert status == 503 and error_of(raw)["code"] == "queue_timeout", raw
        assert int(headers["retry-after"]) >= 1
        stream.wait()
        assert stream.status == 200 and stream.keepalives >= 1
        assert stream.payloads[-1] == "[DONE]" and "queue" in stream.payloads[-2]["error"]["message"]
        assert not stream.content_events
        status, _, raw = joined(running)
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 40
    finally:
        set_step_delay(control, None)
    after = server.wait_until_idle()
    assert after["kv_blocks_used"] == after["kv_blocks_cached"]
    assert after["decode_tokens_total"] - baseline["decode_tokens_total"] <= 40, "a timed-out request decoded"

    log = request_log(server)
    reply = json.loads(raw)
    entry = log[reply["id"]]
    assert (entry["finish_reason"], entry["prompt_tokens"], entry["completion_tokens"]) == (
        "length", reply["usage"]["prompt_tokens"], 40)
    assert 0 <= entry["queue_s"] <= entry["ttft_s"] <= entry["total_s"] and "prompt" not in entry
    timed_out = [e for e in log.values() if e["finish_reason"] == "queue_timeout"]
    assert len(timed_out) == 2 and all(e["ttft_s"] is None and e["queue_s"] is None for e in timed_out)
    assert log[stream.payloads[0]["id"]]["finish_reason"] == "queue_timeout"


def test_a_dead_engine_fails_every_open_request_then_sigterm_exits_0(server, control):
    set_step_delay(control, 0.1)
    running = SSEClient(server, chat_body(max_tokens=300))
    running.wait_for(lambda s: s.content_events >= 2, "the stream to decode")
    waiting = in_thread(lambda: server.chat(chat_body(max_tokens=4)))
    wait_metrics(server, lambda m: m["queue_depth"] == 1, "the second request to wait")
    (control / "fatal").touch()  # the next KV reservation raises FatalEngineError

    running.wait(timeout_s=30)
    assert running.payloads[-1] == "[DONE]"
    assert "engine" in running.payloads[-2]["error"]["message"], running.payloads[-2]
    status, _, raw = joined(waiting, timeout_s=30)
    assert status == 503 and error_of(raw)["code"] == "engine_dead", raw
    status, _, raw = server.request("GET", "/health")
    assert status == 503 and json.loads(raw)["status"] == "dead", raw
    status, _, raw = server.chat(chat_body())
    assert status == 503 and error_of(raw)["code"] == "dead" and "FatalEngineError" in error_of(raw)["message"]
    assert server.request("GET", "/metrics")[0] == 200 and server.alive()

    server.send_signal(signal.SIGTERM)
    assert server.wait_exit(timeout_s=30) == 0


# --- another server: SIGTERM drains --------------------------------------------------------------

SHUTDOWN_TIMEOUT_S = 6


@pytest.fixture(scope="module")
def drain_server(qwen3_tiny, tmp_path_factory):
    control = tmp_path_factory.mktemp("drain-control")
    set_step_delay(control, 0.05)
    proc = controlled_server(qwen3_tiny, control, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S),
                             "--log-requests", "--log-prompts")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(exited=True)


def test_sigterm_finishes_in_flight_streams_aborts_the_rest_and_exits_0(drain_server):
    """Two streams run when SIGTERM arrives: one of 20 tokens (about a second) runs to its end;
    one of 2000 tokens (>= 100 s at 0.05 s a step) is aborted after --shutdown-timeout 6 s. While
    draining, /health and new requests answer 503 "draining"; the process exits 0."""
    short = SSEClient(drain_server, chat_body("Say something short.", max_tokens=20))
    long = SSEClient(drain_server, chat_body("Say something long.", max_tokens=2000))
    for stream in (short, long):
        stream.wait_for(lambda s: s.content_events >= 1, "the streams to decode")
    drain_server.send_signal(signal.SIGTERM)
    status, _, raw = drain_server.request("GET", "/health")
    assert status == 503 and json.loads(raw)["status"] == "draining", raw
    status, _, raw = drain_server.chat(chat_body())
    assert status == 503 and error_of(raw)["code"] == "draining", raw

    short.wait(timeout_s=60)
    final = short.payloads[-2]
    assert short.payloads[-1] == "[DONE]" and final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 20
    long.wait(timeout_s=60)
    assert long.payloads[-1] == "[DONE]" and "error" in long.payloads[-2], long.payloads[-2]
    assert short.events[-1][0] < long.events[-1][0]
    assert drain_server.wait_exit(timeout_s=30) == 0

    log = request_log(drain_server)
    assert log[short.payloads[0]["id"]]["finish_reason"] == "length"
    assert "Say something short." in log[short.payloads[0]["id"]]["prompt"]  # --log-prompts
    assert log[long.payloads[0]["id"]]["finish_reason"] == "shutdown"
