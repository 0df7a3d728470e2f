"""API keys on real servers: every route with no key, a wrong key and each right key (raw HTTP,
the openai client, and the anthropic client with x-api-key or a Bearer token); /health and the OpenAPI document stay open; /metrics is behind the key
unless --metrics-public; keys come from --api-key (several) or QWEN_SERVE_API_KEY
(comma-separated); listening beyond loopback without a key prints a warning."""
from __future__ import annotations

import json
import subprocess
import sys

import anthropic
import openai
import pytest
from server_fixtures import own_server

from qwen_serve.bench.launcher import free_port

BODY = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
PROTECTED = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", BODY), ("GET", "/v1/no-such-route", None)]
METRICS = [("GET", "/metrics", None), ("GET", "/metrics/prometheus", None)]
OPEN = [("GET", "/health", None), ("GET", "/openapi.json", None)]
WRONG = ["", "Bearer", "Bearer wrong-key", "Bearer key-one-and-more", "Bearer key-on", "Basic key-one", "key-one"]


@pytest.fixture(scope="module")
def keyed(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--api-key", "key-one", "--api-key", "key-two"])


@pytest.fixture(scope="module")
def env_keyed(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--metrics-public"],
                          env={"QWEN_SERVE_API_KEY": "env-one, env-two"})


def call(server, method, path, body, authorization: str | None):
    headers = {} if authorization is None else {"Authorization": authorization}
    return server.request(method, path, body, headers=headers)


def expected_ok(path: str) -> int:
    return 404 if path == "/v1/no-such-route" else 200


def assert_refused(status: int, headers: dict, raw: bytes) -> None:
    assert status == 401, raw
    assert headers["www-authenticate"] == "Bearer"
    error = json.loads(raw)["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("method, path, body", PROTECTED + METRICS, ids=lambda v: v if isinstance(v, str) else "")
def test_protected_routes_need_a_right_key(keyed, method, path, body):
    assert_refused(*call(keyed, method, path, body, None))
    for authorization in WRONG:
        assert_refused(*call(keyed, method, path, body, authorization))
    for authorization in ("Bearer key-one", "Bearer key-two", "bearer key-two"):
        status, _, raw = call(keyed, method, path, body, authorization)
        assert status == expected_ok(path), (authorization, raw)


@pytest.mark.parametrize("method, path, body", OPEN, ids=lambda v: v if isinstance(v, str) else "")
def test_health_and_the_openapi_document_stay_open(keyed, method, path, body):
    for authorization in (None, "Bearer wrong-key", "Bearer key-one"):
        assert call(keyed, method, path, body, authorization)[0] == 200


def test_the_openapi_document_says_what_is_protected(keyed):
    doc = json.loads(keyed.request("GET", "/openapi.json")[2])
    assert doc["security"] == [{"bearer": []}] and doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/v1/chat/completions"]["post"]  # the global requirement applies
    assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]


def test_the_openai_client_with_a_wrong_and_a_right_key(keyed):
    with openai.OpenAI(base_url=keyed.base_url, api_key="not-the-key", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="any", messages=BODY["messages"], max_tokens=3, stream=True)
    with openai.OpenAI(base_url=keyed.base_url, api_key="key-two", max_retries=0) as client:
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=BODY["messages"], max_tokens=3)
        assert reply.usage.completion_tokens == 3
        chunks = list(client.chat.completions.create(model=model, messages=BODY["messages"], max_tokens=3,
                                                     stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"


def test_the_anthropic_client_with_x_api_key_and_bearer(keyed):
    """Claude Code sends its key in x-api-key (ANTHROPIC_API_KEY) or as a Bearer token
    (ANTHROPIC_AUTH_TOKEN); a refusal is in Anthropic's error shape."""
    message = {"model": "any", "max_tokens": 3, "messages": BODY["messages"]}
    for headers in ({"x-api-key": "wrong"}, {"x-api-key": "key-one", "Authorization": "Bearer wrong"}):
        status, _, raw = keyed.request("POST", "/v1/messages", message, headers=headers)
        assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error", raw
    for headers in ({"x-api-key": "key-one"}, {"Authorization": "Bearer key-two"}):
        status, _, raw = keyed.request("POST", "/v1/messages", message, headers=headers)
        assert status == 200, raw
    with anthropic.Anthropic(base_url=keyed.url, api_key="key-two", max_retries=0) as client:
        assert client.messages.create(**message).usage.output_tokens == 3
    with anthropic.Anthropic(base_url=keyed.url, api_key="not-the-key", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(**message)


def test_keys_from_the_environment_and_public_metrics(env_keyed):
    for method, path, body in PROTECTED:
        assert_refused(*call(env_keyed, method, path, body, None))
        assert_refused(*call(env_keyed, method, path, body, "Bearer key-one"))  # the other server's key
        for authorization in ("Bearer env-one", "Bearer env-two"):
            assert call(env_keyed, method, path, body, authorization)[0] == expected_ok(path)
    for method, path, body in METRICS + OPEN:
        assert call(env_keyed, method, path, body, None)[0] == 200
    doc = json.loads(env_keyed.request("GET", "/openapi.json")[2])
    assert doc["paths"]["/metrics"]["get"]["security"] == []


@pytest.mark.parametrize("extra, env, warned", [
    ((), {}, True),
    (("--api-key", "k"), {}, False),
    ((), {"QWEN_SERVE_API_KEY": "k"}, False),
], ids=["no key", "--api-key", "env key"])
def test_listening_beyond_loopback_without_a_key_warns(extra, env, warned, monkeypatch):
    """The warning comes before the model loads; a backend that does not exist ends the run there."""
    monkeypatch.delenv("QWEN_SERVE_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = subprocess.run([sys.executable, "-m", "qwen_serve", "--host", "0.0.0.0", "--port", str(free_port()),
                             "--backend", "no-such-backend", *extra], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert ("without an API key" in result.stderr) is warned, result.stderr
