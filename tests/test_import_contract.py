"""The layering contract in pyproject.toml ([tool.importlinter]), checked with import-linter.

The editable install maps qwen_serve onto four folders (core/, backends/, plugins/, conformance/),
which import-linter cannot walk, so each test lays the package out as one tree of symlinks and
points PYTHONPATH at it. The last tests plant an upward import and a torch import to show each contract can fail.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("backends", "plugins", "conformance")


def package_tree(dest: Path, replaced: dict[str, str] | None = None) -> Path:
    """dest/qwen_serve as the installed package sees it; `replaced` swaps core files' text."""
    package = dest / "qwen_serve"
    package.mkdir(parents=True)
    for entry in (ROOT / "core").iterdir():
        if entry.name != "__pycache__" and entry.name not in (replaced or {}):
            (package / entry.name).symlink_to(entry)
    for name, text in (replaced or {}).items():
        (package / name).write_text(text)
    for name in SUBPACKAGES:
        (package / name).symlink_to(ROOT / name)
    return dest


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", command, str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_imports_only_go_down_and_the_core_is_framework_free(tmp_path: Path) -> None:
    result = lint_imports(package_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("planted", "reported"), [
    ("from .engine import llm", "qwen_serve.config -> qwen_serve.engine.llm"),
    ("import torch", "qwen_serve.config -> torch"),
])
def test_a_planted_import_breaks_the_contract(tmp_path: Path, planted: str, reported: str) -> None:
    config = (ROOT / "core" / "config.py").read_text() + f"\n{planted}\n"
    result = lint_imports(package_tree(tmp_path, {"config.py": config}))
    assert result.returncode != 0
    assert "1 kept, 1 broken" in result.stdout and reported in result.stdout, result.stdout
