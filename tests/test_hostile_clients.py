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
from raw_http import connect, head, post, read_until_closed, slow_body_head
from server_fixtures import own_server, request_log

from qwen_serve.server.app import UNREAD_BODY_LINGER_S
from qwen_serve.server.connections import ConnectionGuard

MAX_BATCH, MAX_QUEUE = 2, 2
SLOTS = MAX_BATCH + MAX_QUEUE
TIMEOUT_S = 3.0
MAX_CONNECTIONS = 24
CHAT = "/v1/chat/completions"
NORMAL_REQUEST_BOUND_S = 15.0  # a 4-token reply from the tiny model takes well under a second when all is well
PROBES: list[dict] = []  # what each probe got, for the table printed at the end (pytest -rP)


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


def still_served(server, probe: str, outcome: str) -> None:
    """A normal request is answered within the bound (while or after the probe), and once the
    server settles every KV block is back; both recorded for the module's table."""
    seconds = server.assert_still_serving()
    assert seconds < NORMAL_REQUEST_BOUND_S, (probe, seconds)
    settled = server.wait_until_idle(timeout_s=30)
    PROBES.append({"probe": probe, "outcome": outcome, "normal_request_ms": round(1000 * seconds),
                   "blocks_leaked": settled["kv_blocks_used"] - settled["kv_blocks_cached"],
                   "rss_mib": round(resident_mib(server))})


def chat_body(**fields) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **fields}).encode()


def test_slow_bodies_hold_no_slot_and_get_408(server, rss_at_start):
    slow = [connect(server) for _ in range(5 * SLOTS)]
    for sock in slow:  # the head of a 100,000-byte body, then one byte of it
        sock.sendall(slow_body_head(CHAT))
    still_served(server, "20 POSTs announcing 100,000 bytes, 1 sent", "408 each after 3 s")  # none takes a slot
    for sock in slow:
        reply = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"did not arrive within 3 s" in reply, reply
        sock.close()


def test_slow_heads_and_idle_connections_are_closed_at_the_deadline(server):
    half_head = connect(server)
    half_head.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n")  # and never the rest
    silent = connect(server)
    kept_alive = connect(server)
    kept_alive.sendall(head("GET", "/health"))
    still_served(server, "half a head; a silent connection; an idle kept-alive one", "closed at the deadline")
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
    still_served(server, f"{MAX_CONNECTIONS} connections (the cap) + 1", "the extra one closed on arrival")


def test_pipelined_requests_are_each_answered(server):
    sock = connect(server)
    sock.sendall(head("GET", "/health") + post(CHAT, chat_body()) + head("GET", "/health", "Connection: close"))
    replies = read_until_closed(sock)
    sock.close()
    assert replies.count(b"HTTP/1.1 200") == 3, replies
    still_served(server, "3 pipelined requests in one write", "200 x 3")


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
    still_served(server, "shuts its sending side mid-stream", "aborted as gone")


def test_conflicting_content_length_and_transfer_encoding_is_refused(server):
    sock = connect(server)
    smuggled = head("GET", "/v1/models")
    sock.sendall(head("POST", CHAT, "Content-Length: 4", "Transfer-Encoding: chunked") + b"0\r\n\r\n" + smuggled)
    reply = read_until_closed(sock)
    sock.close()
    status_line = reply.split(b"\r\n", 1)[0]
    assert status_line.split()[1:2] == [b"400"] and reply.count(b"HTTP/1.") == 1, reply[:300]  # the smuggled GET unanswered
    still_served(server, "Content-Length + chunked, a GET smuggled behind", "400, GET unanswered")


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
    still_served(server, "5 MiB chunked body", "413")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth, status", [(63, 200), (64, 400), (200_000, 400)])
def test_nesting_past_64_levels_is_a_400_naming_the_limit(server, depth, status):
    body = '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "extra": %s}' % nested(depth)
    code, _, raw = server.request("POST", CHAT, body)
    assert code == status, raw[:300]  # the object itself is the first level
    if status == 400:
        assert "deeper than 64 levels" in json.loads(raw)["error"]["message"]
    still_served(server, f"JSON nested {depth:,} levels", str(code))


def test_nesting_in_tool_call_arguments_is_a_400(server):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": %s}' % nested(100)}}
    body = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 2}
    code, _, raw = server.request("POST", CHAT, body)
    assert code == 400 and "deeper than 64 levels" in json.loads(raw)["error"]["message"], raw[:300]
    still_served(server, "tool-call arguments 100 levels deep", "400")


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
    still_served(server, "5 clients closing mid-stream", "5 abort lines, no traceback")


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
    still_served(server, f"{SLOTS} streams whose readers never read", "dropped once writes wait 3 s")


@pytest.fixture(scope="module")
def keyed_server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--api-key", "sesame", "--request-timeout", "20"])


def test_without_the_key_a_stranger_costs_no_more_than_its_head(keyed_server):
    """401 as soon as the head is in, and the unread body is not waited for: the connection
    closes after a short linger (aiohttp's default would drain it for 10 s)."""
    sock = connect(keyed_server)
    started = time.monotonic()
    sock.sendall(slow_body_head(CHAT))
    reply = read_until_closed(sock)
    closed_after_s = time.monotonic() - started
    sock.close()
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert closed_after_s < 3 * UNREAD_BODY_LINGER_S, closed_after_s


def test_after_all_probes_memory_is_bounded_and_the_log_clean(server, rss_at_start):
    still_served(server, "after all probes", "")
    samples = prometheus(server)
    assert samples["qwen_serve:connections_refused_total"] >= 1  # the one past the cap
    assert samples["qwen_serve:connections_timed_out_total"] >= 3  # the half head, the silent, the kept-alive
    assert 1 <= samples["qwen_serve:connections_open"] <= 3  # this scrape's own, and any not yet noticed closed
    assert resident_mib(server) < rss_at_start + 150, (rss_at_start, resident_mib(server))
    assert "Traceback" not in server.output(), server.output()[-3000:]
    print(f"\nRSS at start {rss_at_start:.0f} MiB")
    print("| probe | outcome | normal request meanwhile (ms) | blocks leaked | RSS after (MiB) |\n|---|---|---|---|---|")
    for p in PROBES:
        print(f"| {p['probe']} | {p['outcome']} | {p['normal_request_ms']} | {p['blocks_leaked']} | {p['rss_mib']} |")


def test_the_per_client_cap_counts_remote_addresses_only():
    guard = ConnectionGuard(max_total=10, max_per_address=2, head_timeout_s=1.0)
    guard.open_by_address.update({"203.0.113.7": 2, "127.0.0.1": 5})  # 7 open
    assert not guard.admits("203.0.113.7")  # at its cap
    assert guard.admits("203.0.113.8") and guard.admits("127.0.0.1") and guard.admits("::1") and guard.admits("")
    guard.open_by_address["127.0.0.1"] += 3  # 10 open
    assert not guard.admits("127.0.0.1")  # the total binds everyone
