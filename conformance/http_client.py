"""A served model on loopback for the HTTP checks: the real CLI in a subprocess."""
from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator

from .implementations import Implementation
from .server_process import ServerProcess


@contextlib.contextmanager
def running_server(impl: Implementation, model: str, *extra: str) -> Iterator[ServerProcess]:
    server = ServerProcess(["--model", model, "--backend", impl.backend, "--kv-cache", impl.kv_cache,
                            *impl.cli_flags(), *extra],
                           startup_timeout_s=300.0).start()
    try:
        yield server
    finally:
        server.stop()


def chat(server: ServerProcess, body: dict[str, Any]) -> str:
    status, _, raw = server.chat(body, timeout=300.0)
    if status != 200:
        raise AssertionError(f"HTTP {status}: {raw[:500]!r}")
    return json.loads(raw)["choices"][0]["message"]["content"]
