"""HTTP/1.1 spoken byte by byte on a plain socket, as a hostile or broken client would: heads
without bodies, bodies that never end, requests that never finish."""
from __future__ import annotations

import socket

from qwen_serve.bench.launcher import LOOPBACK
from qwen_serve.conformance.server_process import ServerProcess


def connect(server: ServerProcess, receive_buffer: int | None = None) -> socket.socket:
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


def slow_body_head(path: str, announced: int = 100_000) -> bytes:
    """The head of a POST announcing ``announced`` bytes of JSON, and the first byte of it."""
    return head("POST", path, "Content-Type: application/json", f"Content-Length: {announced}") + b"{"


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received
