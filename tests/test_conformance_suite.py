"""The conformance suite is a product: it must run from the installed package, find a plugin
through its entry point or QWEN_SERVE_PLUGIN_MODULES, and fail a broken implementation."""
from __future__ import annotations

from pathlib import Path

import pytest

from qwen_serve.cache_dir import cache_dir

pytest_plugins = ["pytester"]
BROKEN = Path(__file__).parent / "broken_plugins"
# pytester points HOME at a fresh folder; read before it does, so the suites it runs find the
# kernels and kernel choices this machine has built instead of building them again (~25 s each)
MACHINE_CACHE = cache_dir("")


@pytest.fixture
def run_suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(BROKEN))
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(MACHINE_CACHE))

    def run(*args: str):
        return pytester.runpytest_subprocess("--pyargs", "qwen_serve.conformance", "-p", "no:cacheprovider", *args)

    return run


def test_a_leaking_cache_fails_check_5(run_suite, monkeypatch):
    monkeypatch.setenv("QWEN_SERVE_PLUGIN_MODULES", "leaky_kv_cache")
    result = run_suite("--backend", "torch", "--kv-cache", "leaky", "--kv-cache", "paged", "-k", "test_5")
    result.assert_outcomes(passed=2, failed=2)  # on a dense geometry and on a hybrid one
    out = result.stdout.str()
    assert "blocks leaked after every sequence was released" in out
    assert "qwen-serve conformance summary" in out
    table = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| torch-")}
    assert "FAIL" in table["torch-leaky"] and "PASS" in table["torch-paged"]


def test_the_installed_example_plugin_is_found_through_its_entry_point(run_suite):
    from qwen_serve.registry import load_registry

    if "audited-paged" not in load_registry().kv_caches:
        pytest.fail("install the example plugin first: pip install -e examples/audited-kv-cache")
    result = run_suite("--backend", "torch", "--kv-cache", "audited-paged", "-k", "test_5")
    result.assert_outcomes(passed=2)
    assert "torch-audited-paged" in result.stdout.str()


def test_check_7_runs_on_a_rewinding_cache_and_skips_one_that_cannot_rewind(run_suite):
    result = run_suite("--backend", "torch", "--kv-cache", "paged", "--kv-cache", "sliding-window", "-k", "test_7")
    result.assert_outcomes(passed=1, skipped=1)
    out = result.stdout.str()
    table = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| torch-")}
    assert "PASS chi2" in table["torch-paged"] and "skip" in table["torch-sliding-window"]
    assert "cannot roll back rejected drafts (no Rewinding)" in out
