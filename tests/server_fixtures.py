"""Real servers for tests: one per key shared by the whole session or one per module, the
embedded-model server fixtures, the openai client on a server, the controlled-engine plugin's
environment and switches, and the request log a server prints."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Sequence

import openai
import pytest
from scripted_backend import scripted_server_env

from qwen_serve.conformance.server_process import ServerProcess

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


def scripted_server(model: Path, seeds: Mapping[str, object]):
    """Generator body for a module-scoped fixture: a server of ``model`` answering each request
    with the script its seed names (seeds as scripted_backend.write_scripts returns them)."""
    yield from own_server(["--model", str(model), "--backend", "scripted"], env=scripted_server_env(str(seeds["_path"])))


def openai_client(server: ServerProcess) -> openai.OpenAI:
    """The real `openai` client on a test server (use it in a with block)."""
    return openai.OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0, timeout=120)


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
