"""The command line of SPEC §5: every flag in --help, the start-up memory plan and URL, and
one-line errors with exit code 2."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from server_process import smollm2_server  # noqa: F401 (fixture)

SPEC_FLAGS = ("--model", "--quant", "--port", "--max-batch", "--kv-blocks", "--block-size", "--chunk-size",
              "--backend", "--kv-cache", "--dtype", "--host", "--step-budget", "--max-seq-len", "--seed",
              "--no-prefix-cache")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_serve", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_spec_flag():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    assert set(SPEC_FLAGS) <= listed, f"missing from --help: {sorted(set(SPEC_FLAGS) - listed)}"


def test_startup_prints_memory_plan_and_url(smollm2_server):
    """SmolLM2-135M: 30 layers, 3 KV heads x head_dim 64, float32 KV, 16-token blocks, 512 blocks."""
    out = smollm2_server.output()
    kv_per_token = 2 * 30 * 3 * 64 * 4  # 46,080 bytes
    assert re.search(r"\b30 layers\b", out), out
    assert re.search(rf"\b{kv_per_token:,}|\b{kv_per_token}\b|{kv_per_token / 1024:.1f} KiB", out), out
    assert re.search(r"\b512 blocks\b", out) and re.search(r"\b360(\.0)? MiB", out), out  # 512 x 16 x 46,080 B
    assert re.search(r"weights\b.*\d", out, re.IGNORECASE), out
    assert f"http://127.0.0.1:{smollm2_server.port}" in out, out


@pytest.mark.parametrize("flag, installed", [("--backend", "torch"), ("--kv-cache", "paged")])
def test_unknown_plugin_is_a_one_line_error(flag, installed):
    result = run_cli(flag, "no-such-plugin", "--port", "1")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and installed in lines[0] and "Traceback" not in result.stderr, result.stderr
