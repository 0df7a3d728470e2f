"""Shared fixtures: the offline models (docs/models.md), built once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser import browser  # noqa: F401  (Chromium for the modules that drive the page)

# The overload server's fixtures, defined here once for every module: a module that imported them
# would get its own copy of the session-scoped control directory, and the server the modules share
# reads only the first one's (a later module's step-delay then never reached it).
from overload_server import overload_control, overload_server, step_delay  # noqa: F401

from qwen_serve.conformance.models import QWEN3_0_6B, Qwen3Geometry, make_qwen3_checkpoint, smollm2_gguf

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="session")
def qwen3_tiny(tmp_path_factory) -> Path:
    """2 layers, GQA 4:2, tied embeddings."""
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-tiny"), Qwen3Geometry(), seed=1)


@pytest.fixture(scope="session")
def qwen3_untied(tmp_path_factory) -> Path:
    """3 layers, no GQA sharing (heads == kv heads), separate lm_head, wider heads."""
    geometry = Qwen3Geometry(num_hidden_layers=3, hidden_size=96, intermediate_size=192,
                             num_attention_heads=3, num_key_value_heads=3, head_dim=32,
                             tie_word_embeddings=False)
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-untied"), geometry, seed=2)


@pytest.fixture(scope="session")
def qwen3_06b(tmp_path_factory) -> Path:
    """The exact Qwen3-0.6B geometry with random weights (bf16 on disk, 1.2 GB)."""
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-0.6b"), QWEN3_0_6B, seed=3,
                                 dtype="bfloat16", init_std=0.05)
