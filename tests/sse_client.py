"""A raw-HTTP SSE client for lifecycle tests: one request per instance, read on its own thread,
every line kept with the time it arrived, so a test can wait for "the first content event"
and then act (send a signal, kill the engine) while the stream goes on."""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

from stream_checks import KEEPALIVE

from qwen_serve.conformance.server_process import ServerProcess


class SSEClient:
    def __init__(self, server: ServerProcess, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.events: list[tuple[float, str]] = []  # (arrival, event line without its blank line)
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""  # for a non-SSE answer
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, {**body, "stream": True}, headers or {}),
                                        daemon=True)
        self._thread.start()

    def _run(self, server: ServerProcess, body: dict, headers: dict) -> None:
        conn = server.connection(timeout=300)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {"Content-Type": "application/json", **headers})
            response = conn.getresponse()
            self.status = response.status
            self.headers = {k.lower(): v for k, v in response.getheaders()}
            if not self.headers.get("content-type", "").startswith("text/event-stream"):
                self.body = response.read()
                return
            while line := response.readline():
                if line.strip():
                    self.events.append((time.monotonic(), line.decode().rstrip("\n")))
        except BaseException as exc:  # kept for the test to see
            self.error = exc
        finally:
            conn.close()
            self._done.set()

    def wait(self, timeout_s: float = 120.0) -> "SSEClient":
        assert self._done.wait(timeout_s), f"the stream did not end within {timeout_s} s: {self.events[-3:]}"
        assert self.error is None, repr(self.error)
        return self

    def wait_for(self, condition: Callable[["SSEClient"], bool], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition(self):
            assert not self._done.is_set() or condition(self), f"the stream ended before {what}: {self.events[-3:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.events[-3:]}"
            time.sleep(0.01)

    @property
    def payloads(self) -> list[Any]:
        """The data events' JSON ("[DONE]" as the string)."""
        out = []
        for _, line in self.events:
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
        return out

    @property
    def content_events(self) -> int:
        return sum(1 for p in self.payloads if isinstance(p, dict) and "choices" in p
                   and (p["choices"][0]["delta"].get("content") or ""))

    @property
    def keepalives(self) -> int:
        return sum(1 for _, line in self.events if line == KEEPALIVE)
