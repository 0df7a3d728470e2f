"""Schemathesis drives the live server from its own GET /openapi.json: requests generated
from the documented schema (valid ones and, in negative mode, ones that break it) must never
get a 5xx, and every answer must match the documented status codes, content types and
bodies. Afterwards no KV block is left behind and the server still serves.

The server is the small overload one (tests/overload_server.py): --max-seq-len 256 keeps
generated max_tokens short, so the run takes seconds.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schema_checks import call_and_check
from schemathesis import GenerationMode

EXAMPLES = 30  # per operation and generation mode
# the generating operations: their rich schemas need more examples to reach a 200
GENERATING = {"/v1/chat/completions": 150, "/v1/completions": 150, "/v1/messages": 60, "/v1/responses": 60}


@pytest.fixture(scope="module")
def api_schema(overload_server):
    return schemathesis.openapi.from_url(overload_server.url + "/openapi.json")


@pytest.fixture(scope="module")
def api_document(overload_server) -> dict:
    status, _, body = overload_server.request("GET", "/openapi.json")
    assert status == 200
    return json.loads(body)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_documented_operation_holds_its_contract(api_schema, api_document, mode):
    """schema_checks.call_and_check on every operation. (schemathesis' pytest integration does
    not run on pytest 9 yet, so its strategies run under plain hypothesis.)"""

    seen: Counter = Counter()
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # a GET without parameters has no invalid request to make

        @given(case=operation.as_strategy(mode))
        @settings(max_examples=GENERATING.get(operation.path, EXAMPLES), deadline=None,
                  database=None, derandomize=True, suppress_health_check=list(HealthCheck))
        def holds(case):
            seen[case.method.upper(), case.path, call_and_check(case, api_document, mode is GenerationMode.NEGATIVE)] += 1

        holds()
    print(f"\n{mode.value} requests by operation and status: {dict(sorted(seen.items()))}")
    for path in GENERATING:
        statuses = {status for _, p, status in seen if p == path}
        assert (200 if mode is GenerationMode.POSITIVE else 400) in statuses, f"the fuzzer never got there: {seen}"


def test_nothing_leaked_and_still_serving(overload_server):
    m = overload_server.wait_until_idle(timeout_s=30)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0 and m["queue_depth"] == 0
    overload_server.assert_still_serving()
