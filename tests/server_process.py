"""Test helpers around the server process: shared servers per session, SSE parsing, and a
collector that checks the openai-client chunk contract."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import openai
import pytest

from qwen_serve.conformance.server_process import ServerProcess

KEEPALIVE = ": keep-alive"


def sse_events(raw: bytes) -> list[str]:
    """Every event of an SSE body, each a single line followed by a blank line (fails on a
    missing terminator or a multi-line event): `data: ...` events and `: keep-alive` comments."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    for event in events:
        assert (event.startswith("data: ") or event == KEEPALIVE) and "\n" not in event, \
            f"not a single-line data event or keep-alive comment: {event!r}"
    return events


def parse_sse(raw: bytes) -> list[str]:
    """The payloads of an SSE body that must consist only of `data: ...` events, each followed
    by a blank line, and the server's `: keep-alive` comments (skipped; a slow machine may see
    them); fails on anything else (other comments, other fields, a missing terminator)."""
    return [event[len("data: "):] for event in sse_events(raw) if event != KEEPALIVE]


_SHARED: dict[str, ServerProcess] = {}


def shared_server(request: pytest.FixtureRequest, key: str, args: Sequence[str],
                  env: dict[str, str] | None = None) -> ServerProcess:
    """One server per key for the whole session (stopped when the session ends), so several
    test modules can use the same slow-to-load model without starting it twice."""
    server = _SHARED.get(key)
    if server is None or not server.alive():
        server = ServerProcess(args, env=env).start()
        _SHARED[key] = server
        request.session.addfinalizer(server.stop)
    return server


def own_server(args: Sequence[str], env: Mapping[str, str] | None = None):
    """Generator body for a module-scoped fixture: a server that lives as long as the fixture."""
    server = ServerProcess(args, env=env).start()
    try:
        yield server
    finally:
        server.stop()


def openai_client(server: ServerProcess) -> openai.OpenAI:
    """The real `openai` client on a test server (use it in a with block)."""
    return openai.OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0, timeout=120)


class StreamCollector:
    """Joins the chunks of an openai-client stream and checks the chunk contract on the way:
    the first chunk only says role "assistant"; finish_reason and usage appear once, in the
    last chunk."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.pieces: list[str] = []
        self.logprobs: list[Any] = []

    def add(self, chunk: Any) -> None:
        assert chunk.object == "chat.completion.chunk"
        if not self.chunks:
            assert chunk.choices[0].delta.role == "assistant" and not chunk.choices[0].delta.content
        self.chunks.append(chunk)
        choice = chunk.choices[0]
        self.pieces.append(choice.delta.content or "")
        if choice.logprobs is not None and choice.logprobs.content:
            self.logprobs.extend(choice.logprobs.content)

    def collect(self, stream) -> "StreamCollector":
        for chunk in stream:
            self.add(chunk)
        return self

    async def acollect(self, stream) -> "StreamCollector":
        async for chunk in stream:
            self.add(chunk)
        return self

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str:
        reasons = [(i, c.choices[0].finish_reason) for i, c in enumerate(self.chunks) if c.choices[0].finish_reason]
        assert len(reasons) == 1 and reasons[0][0] == len(self.chunks) - 1, f"finish_reason in chunks {reasons}"
        return reasons[0][1]

    @property
    def usage(self) -> Any:
        usages = [(i, c.usage) for i, c in enumerate(self.chunks) if c.usage is not None]
        assert len(usages) == 1 and usages[0][0] == len(self.chunks) - 1, f"usage in chunks {[i for i, _ in usages]}"
        return usages[0][1]


@pytest.fixture(scope="module")
def smollm2_server(request: pytest.FixtureRequest) -> ServerProcess:
    """The embedded default model (started without --model), shared across modules."""
    return shared_server(request, "smollm2-default", [])


@pytest.fixture(scope="module")
def smollm2_model_name(smollm2_server: ServerProcess) -> str:
    status, _, body = smollm2_server.request("GET", "/v1/models")
    assert status == 200, body
    return json.loads(body)["data"][0]["id"]


PLUGINS = Path(__file__).parent / "server_plugins"


def controlled_env(control: Path) -> dict[str, str]:
    """The environment that loads tests/server_plugins/controlled_engine.py into a server,
    steered by files in control."""
    return {"QWEN_SERVE_PLUGIN_MODULES": "controlled_engine", "QWEN_SERVE_TEST_CONTROL": str(control),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))}


def set_step_delay(control: Path, seconds: float | None) -> None:
    """Every model call of a controlled server sleeps this long first (None: no delay)."""
    path = control / "step-delay"
    if seconds is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(str(seconds))


def request_log(server: ServerProcess) -> dict[str, dict]:
    """The --log-requests lines the server printed so far, by request id."""
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith('{"event": "request"')]
    return {entry["id"]: entry for entry in lines}
