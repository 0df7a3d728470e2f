"""Strangers on the network, tried on one real server (tiny random Qwen3, 2 running + 2 waiting
requests, 3-second request deadline, 24 connections at most): slow heads, slow and oversized
bodies, idle and half-closed connections, pipelining, a smuggling attempt, absurd nesting,
clients that leave mid-stream and readers that never read. After each probe a normal client is
still served (never a 429 it did not earn), every KV block comes back, and over the whole
module the server's resident memory stays bounded and its log holds no traceback."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import own_server, request_log

from qwen_serve.conformance.server_process import LOOPBACK
from qwen_serve.server.connections import ConnectionGuard

MAX_BATCH, MAX_QUEUE = 2, 2
SLOTS = MAX_BATCH + MAX_QUEUE
TIMEOUT_S = 3.0
MAX_CONNECTIONS = 24
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE),
                           "--request-timeout", str(TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
                           "--log-requests"])


@pytest.fixture(scope="module")
def rss_at_start(server):
    return resident_mib(server)


def resident_mib(server) -> float:
    with open(f"/proc/{server.proc.pid}/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kib / 1024


def connect(server, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect((LOOPBACK, server.port))
    return sock


def head(method: str, path: str, *lines: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: test", *lines, "", ""]).encode()


def post(path: str, body: bytes, *lines: str) -> bytes:
    return head("POST", path, "Content-Type: application/json", f"Content-Length: {len(body)}", *lines) + body


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def chat_body(**fields) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **fields}).encode()


def test_slow_bodies_hold_no_slot_and_get_408(server, rss_at_start):
    slow = [connect(server) for _ in range(5 * SLOTS)]
    for sock in slow:  # the head of a 100,000-byte body, then one byte of it
        sock.sendall(head("POST", CHAT, "Content-Type: application/json", "Content-Length: 100000") + b"{")
    server.assert_still_serving()  # 20 half-sent bodies take none of the 4 slots
    for sock in slow:
        reply = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"did not arrive within 3 s" in reply, reply
        sock.close()
    server.wait_until_idle()


def test_slow_heads_and_idle_connections_are_closed_at_the_deadline(server):
    half_head = connect(server)
    half_head.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n")  # and never the rest
    silent = connect(server)
    kept_alive = connect(server)
    kept_alive.sendall(head("GET", "/health"))
    server.assert_still_serving()
    started = time.monotonic()
    for sock in (half_head, silent):
        assert read_until_closed(sock) == b""
    assert read_until_closed(kept_alive).startswith(b"HTTP/1.1 200")  # its answer, then the close
    assert time.monotonic() - started < 20 * TIMEOUT_S  # closed by the server, not by our own timeout
    for sock in (half_head, silent, kept_alive):
        sock.close()


def prometheus(server) -> dict[str, float]:
    status, _, raw = server.request("GET", "/metrics/prometheus")
    assert status == 200
    return {s.name: s.value for family in text_string_to_metric_families(raw.decode()) for s in family.samples}


def wait_until_no_other_connection(server) -> None:
    deadline = time.monotonic() + 20
    while prometheus(server)["qwen_serve:connections_open"] > 1:  # the scrape's own
        assert time.monotonic() < deadline, "earlier connections still open"
        time.sleep(0.1)


def test_connections_past_the_cap_are_refused_until_some_close(server):
    wait_until_no_other_connection(server)
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    for sock in held:  # each answered: every one is open on the server's side
        sock.sendall(head("GET", "/health"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    refused = connect(server)
    refused.sendall(head("GET", "/health"))
    assert read_until_closed(refused) == b""
    refused.close()
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 10
    while True:  # the server notices the closes as they come
        try:
            server.assert_still_serving()
            break
        except (ConnectionError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_pipelined_requests_are_each_answered(server):
    sock = connect(server)
    sock.sendall(head("GET", "/health") + post(CHAT, chat_body()) + head("GET", "/health", "Connection: close"))
    replies = read_until_closed(sock)
    sock.close()
    assert replies.count(b"HTTP/1.1 200") == 3, replies


def test_a_half_closed_client_counts_as_gone(server):
    """aiohttp closes a connection whose client has shut its sending side (HTTP/1.1 clients do
    not half-close): the request is aborted and its blocks return, as for any client that left."""
    before = sum(e["finish_reason"] == "abort" for e in request_log(server).values())
    sock = connect(server)
    sock.sendall(post(CHAT, chat_body(stream=True, max_tokens=400, ignore_eos=True)))
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # streaming has begun
    sock.shutdown(socket.SHUT_WR)
    read_until_closed(sock)
    sock.close()
    server.wait_until_idle()
    assert sum(e["finish_reason"] == "abort" for e in request_log(server).values()) == before + 1
    server.assert_still_serving()


def test_conflicting_content_length_and_transfer_encoding_is_refused(server):
    sock = connect(server)
    smuggled = head("GET", "/v1/models")
    sock.sendall(head("POST", CHAT, "Content-Length: 4", "Transfer-Encoding: chunked") + b"0\r\n\r\n" + smuggled)
    reply = read_until_closed(sock)
    sock.close()
    status_line = reply.split(b"\r\n", 1)[0]
    assert status_line.split()[1:2] == [b"400"] and reply.count(b"HTTP/1.") == 1, reply[:300]  # the smuggled GET unanswered
    server.assert_still_serving()


def test_an_oversized_chunked_body_is_413(server):
    sock = connect(server)
    sock.sendall(head("POST", CHAT, "Content-Type: application/json", "Transfer-Encoding: chunked"))
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)

    def send_body() -> None:
        try:
            for _ in range(80):  # 5 MiB, past the 4 MiB limit
                sock.sendall(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server has answered and closed: the rest has nowhere to go
            pass

    sender = threading.Thread(target=send_body)
    sender.start()
    reply = read_until_closed(sock)
    sender.join()
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    server.assert_still_serving()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth, status", [(63, 200), (64, 400), (200_000, 400)])
def test_nesting_past_64_levels_is_a_400_naming_the_limit(server, depth, status):
    body = '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "extra": %s}' % nested(depth)
    code, _, raw = server.request("POST", CHAT, body)
    assert code == status, raw[:300]  # the object itself is the first level
    if status == 400:
        assert "deeper than 64 levels" in json.loads(raw)["error"]["message"]


def test_nesting_in_tool_call_arguments_is_a_400(server):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": %s}' % nested(100)}}
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 2}
    code, _, raw = server.request("POST", CHAT, body)
    assert code == 400 and "deeper than 64 levels" in json.loads(raw)["error"]["message"], raw[:300]


def test_clients_that_leave_mid_stream_are_a_log_line_each_not_a_traceback(server):
    body = chat_body(stream=True, max_tokens=400, ignore_eos=True)
    for _ in range(5):
        sock = connect(server)
        sock.sendall(post(CHAT, body))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # streaming has begun
        sock.close()
    server.wait_until_idle()
    assert sum(e["finish_reason"] == "abort" for e in request_log(server).values()) >= 5
    assert "Traceback" not in server.output()


def test_readers_that_never_read_lose_their_streams_not_the_slots(server):
    body = chat_body(stream=True, max_tokens=1500, ignore_eos=True, logprobs=True, top_logprobs=20, n=2)
    stalled = [connect(server, receive_buffer=4096) for _ in range(SLOTS)]
    for sock in stalled:  # each event is ~4 KB: the socket buffers fill long before the end
        sock.sendall(post(CHAT, body))
    deadline = time.monotonic() + 120
    while True:  # every slot is taken until the server gives up on the stalled readers
        status, _, raw = server.chat(json.loads(chat_body()))
        if status == 200:
            break
        assert status == 429 and time.monotonic() < deadline, (status, raw[:300])
        time.sleep(0.5)
    for sock in stalled:
        sock.close()
    server.wait_until_idle(timeout_s=30)


def test_after_all_probes_memory_is_bounded_and_the_log_clean(server, rss_at_start):
    server.assert_still_serving()
    server.wait_until_idle()
    samples = prometheus(server)
    assert samples["qwen_serve:connections_refused_total"] >= 1  # the one past the cap
    assert samples["qwen_serve:connections_timed_out_total"] >= 3  # the half head, the silent, the kept-alive
    assert 1 <= samples["qwen_serve:connections_open"] <= 3  # this scrape's own, and any not yet noticed closed
    assert resident_mib(server) < rss_at_start + 150, (rss_at_start, resident_mib(server))
    assert "Traceback" not in server.output(), server.output()[-3000:]


def test_the_per_client_cap_counts_remote_addresses_only():
    guard = ConnectionGuard(max_total=10, max_per_address=2, head_timeout_s=1.0)
    guard.open_by_address.update({"203.0.113.7": 2, "127.0.0.1": 5})  # 7 open
    assert not guard.admits("203.0.113.7")  # at its cap
    assert guard.admits("203.0.113.8") and guard.admits("127.0.0.1") and guard.admits("::1") and guard.admits("")
    guard.open_by_address["127.0.0.1"] += 3  # 10 open
    assert not guard.admits("127.0.0.1")  # the total binds everyone
