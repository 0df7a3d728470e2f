"""The agent CLIs people drive local models with, run headless against a live server: Claude
Code (Anthropic's Messages API) and Codex (OpenAI's Responses API). Their binaries come from npm (tests/agent_clis/package.json,
installed by the README's test command); the server is the scripted backend on a random Qwen3
checkpoint with room for Claude Code's ~12k-token system prompt and tools, answering every
request (the CLIs send no seed) with one known reply.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tokenizers
from scripted_backend import DEFAULT_ENV, scripted_server_env
from server_fixtures import own_server, request_log

from qwen_serve.conformance.models import IM_END, Qwen3Geometry, make_qwen3_checkpoint

BIN = Path(__file__).parent / "agent_clis" / "node_modules" / ".bin"
REPLY = "Hello from qwen-serve."
CONTEXT = 40_000  # Claude Code's first request is ~12k tokens; its answer may take 32k


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (BIN / "claude").exists():
        pytest.skip(f"the agent CLIs are not installed: npm install --prefix {BIN.parent.parent}")
    root = tmp_path_factory.mktemp("agent-model")
    checkpoint = make_qwen3_checkpoint(root / "checkpoint", Qwen3Geometry(max_position_embeddings=65536), seed=1)
    tokenizer = tokenizers.Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    scripts = root / "scripts.json"
    scripts.write_text(json.dumps([tokenizer.encode(REPLY, add_special_tokens=False).ids + [IM_END]]))
    env = scripted_server_env(str(scripts)) | {DEFAULT_ENV: "0"}
    yield from own_server(["--model", str(checkpoint), "--backend", "scripted", "--max-seq-len", str(CONTEXT),
                           "--kv-blocks", str(2 * CONTEXT // 16), "--log-requests"], env=env)


def claude(server, home: Path, prompt: str) -> dict:
    """``claude -p`` with the settings docs/serving.md gives users; its JSON result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env |= {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_AUTH_TOKEN": "any", "ANTHROPIC_MODEL": "qwen",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "qwen", "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "HOME": str(home)}
    done = subprocess.run([str(BIN / "claude"), "-p", prompt, "--output-format", "json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_claude_code_answers_and_its_long_prompt_hits_the_prefix_cache(server, tmp_path):
    first = claude(server, tmp_path, "say hi")
    assert first["is_error"] is False and first["result"] == REPLY, first
    second = claude(server, tmp_path, "say hi")
    assert second["result"] == REPLY
    # Claude Code counts what the prefix cache served as cache reads, as Anthropic reports them.
    assert second["usage"]["cache_read_input_tokens"] > 10_000, second["usage"]
    requests = list(request_log(server).values())
    assert len(requests) >= 2 and all(r["finish_reason"] == "stop" for r in requests), requests
    assert requests[-1]["prompt_tokens"] > 10_000 and requests[-1]["cached_tokens"] > 10_000


def codex(server, home: Path, prompt: str) -> str:
    """``codex exec`` with a model provider entry as docs/serving.md gives it; what it printed."""
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        'model = "qwen"\nmodel_provider = "qwen-serve"\n\n[model_providers.qwen-serve]\nname = "qwen-serve"\n'
        f'base_url = "{server.base_url}"\nwire_api = "responses"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))} | {"CODEX_HOME": str(home)}
    done = subprocess.run([str(BIN / "codex"), "exec", "--skip-git-repo-check", prompt], env=env, cwd=home,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_codex_answers_and_its_prompt_hits_the_prefix_cache(server, tmp_path):
    before = set(request_log(server))
    for _ in range(2):
        assert REPLY in codex(server, tmp_path / "codex", "say hi")
    requests = [r for key, r in request_log(server).items() if key not in before]
    assert [r["id"].startswith("resp_") for r in requests] == [True, True], requests
    assert all(r["finish_reason"] == "stop" for r in requests)
    assert requests[-1]["prompt_tokens"] > 5_000 and requests[-1]["cached_tokens"] > 5_000, requests
