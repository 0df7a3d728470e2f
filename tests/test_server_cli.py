"""The command line: every flag in --help, the start-up memory plan and URL, and
one-line errors with exit code 2, a serving flag reaching the server."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry
from server_fixtures import smollm2_server  # noqa: F401 (fixture)

from qwen_serve.config import EngineConfig
from qwen_serve.server.app import ChatServer
from qwen_serve.server.cli import build_parser, serve_settings

DOCUMENTED_FLAGS = ("--model", "--quant", "--port", "--max-batch", "--kv-blocks", "--block-size", "--chunk-size",
              "--backend", "--kv-cache", "--dtype", "--host", "--step-budget", "--max-seq-len", "--seed",
              "--no-prefix-cache")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_serve", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_spec_flag():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    assert set(DOCUMENTED_FLAGS) <= listed, f"missing from --help: {sorted(set(DOCUMENTED_FLAGS) - listed)}"


def test_startup_prints_memory_plan_and_url(smollm2_server):
    """SmolLM2-135M: 30 layers, 3 KV heads x head_dim 64, 16-token blocks, 512 blocks; the KV
    dtype the plan states (--kv-dtype auto: the backend's choice for this CPU) sets the bytes."""
    out = smollm2_server.output()
    kv_dtype = re.search(r"\bKV (float32|bfloat16) \(auto", out)
    assert kv_dtype, out
    kv_per_token = 2 * 30 * 3 * 64 * {"float32": 4, "bfloat16": 2}[kv_dtype[1]]  # 46,080 or 23,040 bytes
    pool_mib = 512 * 16 * kv_per_token / 2**20  # 360 or 180
    assert re.search(r"\b30 layers\b", out), out
    assert re.search(rf"\b{kv_per_token:,}|\b{kv_per_token}\b|{kv_per_token / 1024:.1f} KiB", out), out
    assert re.search(r"\b512 blocks\b", out) and re.search(rf"\b{pool_mib:.0f}(\.0)? MiB", out), out
    assert re.search(r"weights\b.*\d", out, re.IGNORECASE), out
    assert f"http://127.0.0.1:{smollm2_server.port}" in out, out


def test_an_unknown_kv_dtype_is_a_one_line_error():
    result = run_cli("--kv-dtype", "int3", "--port", "1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "int3" in lines[0] and "bfloat16" in lines[0], result.stderr


def test_responses_store_mb_reaches_the_server():
    settings = serve_settings(build_parser().parse_args(["--responses-store-mb", "0.5"]), EngineConfig())
    assert ChatServer(settings.options, CollectorRegistry()).responses_store.max_bytes == 2**19
    with pytest.raises(ValueError, match="--responses-store-mb"):
        serve_settings(build_parser().parse_args(["--responses-store-mb", "-1"]), EngineConfig())


@pytest.mark.parametrize("flag, installed", [("--backend", "torch"), ("--kv-cache", "paged")])
def test_unknown_plugin_is_a_one_line_error(flag, installed):
    result = run_cli(flag, "no-such-plugin", "--port", "1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and installed in lines[0] and "Traceback" not in result.stderr, result.stderr
