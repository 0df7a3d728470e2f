"""A served model on loopback for the HTTP checks: the real CLI in a subprocess."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Iterator

from .implementations import Implementation


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(impl: Implementation, model: str, *extra: str, timeout_s: float = 180.0) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "qwen_serve", "--model", model, "--backend", impl.backend,
           "--kv-cache", impl.kv_cache, "--port", str(port), *extra]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read().decode(errors='replace')}")
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s")
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def post_json(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def chat(base_url: str, body: dict[str, Any]) -> str:
    return post_json(base_url + "/v1/chat/completions", body)["choices"][0]["message"]["content"]
