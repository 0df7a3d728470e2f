"""Where qwen-serve keeps what it computes once per machine: $QWEN_SERVE_CACHE, else
$XDG_CACHE_HOME/qwen_serve, else ~/.cache/qwen_serve; one subdirectory per kind."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    base = os.environ.get("QWEN_SERVE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "qwen_serve")
    return Path(base).expanduser() / kind
