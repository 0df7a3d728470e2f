"""A real `python -m qwen_serve` process on loopback, for HTTP checks and tests: the bench's
launcher (a free port, wait for GET /health, the tail of the output when it fails) running our
own command, plus the requests the checks make.
"""
from __future__ import annotations

import http.client
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from qwen_serve.bench.launcher import LOOPBACK, PORT, TAIL_CHARS, LaunchedServer


class ServerProcess(LaunchedServer):
    """`python -m qwen_serve [entry...] --host 127.0.0.1 --port PORT args...`; `entry` names a
    subcommand (("ray",)). SIGTERM goes to the server alone: it stops what it started itself."""

    def __init__(self, args: Sequence[str], startup_timeout_s: float = 120.0, env: Mapping[str, str] | None = None,
                 entry: Sequence[str] = ()) -> None:
        self.args = list(args)
        super().__init__([sys.executable, "-m", "qwen_serve", *entry, "--host", LOOPBACK, "--port", PORT, *self.args],
                         name="qwen-serve", env=env, startup_timeout_s=startup_timeout_s, stop_whole_group=False,
                         stop_timeout_s=15.0)
        self.base_url = f"{self.url}/v1"

    def start(self, ready: bool = True) -> "ServerProcess":
        super().start(ready)
        return self

    def stop(self, exited: bool = False) -> None:
        """Terminate the server and remove its log; fails, with its output, if it had died on its
        own (unless the caller made it exit: exited=True)."""
        died = not exited and self.proc is not None and self.proc.poll() is not None
        self.terminate()
        output = self.output()
        os.unlink(self.log)
        if died:
            raise RuntimeError(f"the server exited (code {self.proc.returncode}) while tests were using it\n"
                               f"{output[-TAIL_CHARS:]}")

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code, once the process has exited (subprocess.TimeoutExpired after timeout_s)."""
        return self.proc.wait(timeout=timeout_s)

    # --- raw HTTP -----------------------------------------------------------------------
    def connection(self, timeout: float = 120.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None, timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
        """One request on a fresh connection: (status, headers with lower-case names, body)."""
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        headers = dict(headers or {})
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def chat(self, body: dict, timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
        return self.request("POST", "/v1/chat/completions", body, timeout=timeout)

    def metrics(self) -> dict[str, Any]:
        status, _, body = self.request("GET", "/metrics", headers={"Accept": "application/json"})
        assert status == 200, body
        return json.loads(body)

    def assert_still_serving(self) -> float:
        """A plain request gets a normal reply and /health says ok: the seconds the request took."""
        started = time.monotonic()
        status, _, raw = self.chat({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
        seconds = time.monotonic() - started
        assert status == 200, raw
        reply = json.loads(raw)
        assert reply["choices"][0]["finish_reason"] in ("stop", "length") and reply["usage"]["completion_tokens"] >= 1
        status, _, raw = self.request("GET", "/health")
        assert status == 200 and json.loads(raw)["status"] == "ok", raw
        return seconds

    def wait_until_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll /metrics until nothing runs or waits and only prefix-cached blocks stay used.

        Two idle readings 0.1 s apart must agree, so a snapshot published just before the
        last engine step cannot pass for the settled state."""
        deadline = time.monotonic() + timeout_s
        previous = None
        while True:
            m = self.metrics()
            idle = m["requests_active"] == 0 and m["queue_depth"] == 0 and m["kv_blocks_used"] == m["kv_blocks_cached"]
            if idle and previous is not None and _counters(m) == _counters(previous):
                return m
            previous = m if idle else None
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle {timeout_s} s later: requests_active={m['requests_active']}, "
                                     f"queue_depth={m['queue_depth']}, kv_blocks_used={m['kv_blocks_used']}, "
                                     f"kv_blocks_cached={m['kv_blocks_cached']}")
            time.sleep(0.1)


def _counters(m: dict[str, Any]) -> tuple:
    return tuple(m[k] for k in ("requests_total", "prefill_tokens_total", "decode_tokens_total",
                                "kv_blocks_used", "kv_blocks_cached", "prefix_cache_hits"))
