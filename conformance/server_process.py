"""A real `python -m qwen_serve` process on loopback, for HTTP checks and tests.

The server runs as a subprocess on a free port; start() waits for GET /health and, when the
process dies or never answers, fails with the tail of its output so the cause is visible.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: Sequence[str], startup_timeout_s: float = 120.0, env: Mapping[str, str] | None = None) -> None:
        self.args = list(args)
        self.env = dict(env or {})  # added to the server's environment (e.g. QWEN_SERVE_PLUGIN_MODULES)
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.base_url = f"{self.url}/v1"
        fd, self._log_path = tempfile.mkstemp(prefix="qwen-serve-", suffix=".log")
        os.close(fd)
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "qwen_serve", "--host", LOOPBACK, "--port", str(self.port), *self.args]

    def start(self, ready: bool = True) -> "ServerProcess":
        """Wait until /health says ok, or with ready=False only until the port answers (the
        server answers 503 "loading" while the model loads)."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", **self.env)
        with open(self._log_path, "ab") as log:  # append mode: our reads never move the child's writes
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {self.proc.returncode} before answering /health\n"
                                   f"{' '.join(self.command)}\n{self.output()[-4000:]}")
            try:
                status, _, _ = self.request("GET", "/health", timeout=2.0)
                if status == 200 or not ready:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self._terminate()
        raise RuntimeError(f"server did not answer /health within {self.startup_timeout_s:.0f} s\n{self.output()[-4000:]}")

    def stop(self, exited: bool = False) -> None:
        """Terminate the server; fails, with its output, if it had died on its own (unless the
        caller made it exit: exited=True)."""
        died = not exited and self.proc is not None and self.proc.poll() is not None
        self._terminate()
        output = self.output()
        os.unlink(self._log_path)
        if died:
            raise RuntimeError(f"the server exited (code {self.proc.returncode}) while tests were using it\n"
                               f"{output[-4000:]}")

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit code, once the process has exited (subprocess.TimeoutExpired after timeout_s)."""
        return self.proc.wait(timeout=timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the server printed so far (stdout and stderr)."""
        with open(self._log_path, "rb") as log:
            return log.read().decode("utf-8", errors="replace")

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
