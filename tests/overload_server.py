"""The small, priority-scheduled server that tests/test_server_overload.py loads and
tests/test_server_fuzz.py fuzzes: one process for the session (tiny random Qwen3 on the
controlled test plugin, --max-batch 2 --max-queue 4)."""
from __future__ import annotations

import pytest
from server_fixtures import controlled_env, set_step_delay, shared_server

MAX_BATCH, MAX_QUEUE = 2, 4
MAX_SEQ_LEN = 256
SERVER_ARGS = ["--backend", "controlled", "--kv-cache", "controlled", "--max-batch", str(MAX_BATCH),
               "--max-queue", str(MAX_QUEUE), "--scheduling-policy", "priority", "--kv-blocks", "64",
               "--chunk-size", "16", "--max-seq-len", str(MAX_SEQ_LEN), "--log-requests"]


@pytest.fixture(scope="session")
def overload_control(tmp_path_factory):
    return tmp_path_factory.mktemp("overload-control")


@pytest.fixture(scope="module")
def overload_server(request, qwen3_tiny, overload_control):
    return shared_server(request, "overload", ["--model", str(qwen3_tiny), *SERVER_ARGS],
                         env=controlled_env(overload_control))


@pytest.fixture
def step_delay(overload_control):
    """Sets the model-call delay of the overload server for one test."""

    def set_delay(seconds: float | None) -> None:
        set_step_delay(overload_control, seconds)

    yield set_delay
    set_step_delay(overload_control, None)
