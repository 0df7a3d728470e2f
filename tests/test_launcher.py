"""The bench's launcher (qwen_serve.bench.launcher) on real processes: a tiny HTTP server it
starts on a free port, waits for and stops, and commands that fail, whose log tail the error shows."""
from __future__ import annotations

import sys
import time

import pytest

from qwen_serve.bench.launcher import LaunchedServer

# GET /health answers 503 until ready_after_s (argv[2]) have passed, then 200.
TINY_SERVER = r'''
import http.server, sys, time
started, ready_after_s = time.monotonic(), float(sys.argv[2])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = time.monotonic() - started >= ready_after_s
        self.send_response(200 if self.path == "/health" and ready else 503)
        self.end_headers()
print("tiny server listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
'''


def tiny(ready_after_s: float = 0.0, **options) -> LaunchedServer:
    return LaunchedServer([sys.executable, "-c", TINY_SERVER, "{port}", str(ready_after_s)], name="tiny", **options)


def test_starts_on_a_free_port_waits_for_health_and_stops():
    with tiny(ready_after_s=0.5) as server:
        assert server.alive() and server.health_status() == 200
        assert str(server.port) in server.argv and server.url.endswith(f":{server.port}")
        assert server.startup_s >= 0.5  # the 503s were waited out
        assert "tiny server listening" in server.output()
    assert not server.alive() and server.health_status() is None


def test_not_ready_returns_once_health_answers_at_all():
    server = tiny(ready_after_s=60).start(ready=False)
    try:
        assert server.health_status() == 503
    finally:
        server.stop()
    assert server.proc.returncode is not None


def test_a_command_that_exits_fails_with_the_tail_of_its_log():
    command = [sys.executable, "-c", "import sys; print('x' * 5000); print('the cause: no model here'); sys.exit(3)"]
    server = LaunchedServer(command, name="doomed")
    with pytest.raises(RuntimeError) as failure:
        server.start()
    message = str(failure.value)
    assert "doomed exited with code 3 before answering /health" in message
    assert message.rstrip().endswith("the cause: no model here") and "x" * 3000 in message
    assert len(message) < 4000 + 500  # the tail, not the whole log


def test_a_server_that_never_gets_healthy_is_stopped_after_the_timeout():
    server = tiny(ready_after_s=60, startup_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"tiny did not answer /health within 1 s(.|\n)*tiny server listening"):
        server.start()
    assert time.monotonic() - started < 20
    assert not server.alive()  # stopped, not left running


def test_stop_reaches_the_children_of_the_command():
    """A shell that starts the server as its child: stopping signals the whole process group."""
    script = f"{sys.executable} -c '{TINY_SERVER}' \"$1\" 0; echo never"
    server = LaunchedServer(["sh", "-c", script, "sh", "{port}"], name="wrapped")
    with server:
        assert server.health_status() == 200
    deadline = time.monotonic() + 10
    while server.health_status() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.health_status() is None
