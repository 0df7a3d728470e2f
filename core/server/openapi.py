"""GET /openapi.json: an OpenAPI 3.1 description of the routes this server serves, with the
request schema that qwen_serve.openai.protocol enforces (a fuzz test drives the live server
from it: tests/test_server_fuzz.py). Built per server, so its security section says which
routes this server's --api-key / --metrics-public protect."""
from __future__ import annotations

from typing import Any

from ..openai.protocol import DEFAULT_MAX_TOKENS, ROLES

INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
ERROR = {"$ref": "#/components/schemas/Error"}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def _error(description: str, headers: dict | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": ERROR}}}
    if headers:
        response["headers"] = headers
    return response


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
MESSAGE = {
    "type": "object", "required": ["role", "content"],
    "properties": {
        "role": {"enum": list(ROLES)},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]},
    },
}
CHAT_REQUEST = {
    "type": "object", "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "model": {"type": "string", "description": "optional; a name this server does not serve is a 404"},
        "max_tokens": {"type": "integer", "minimum": 1, "default": DEFAULT_MAX_TOKENS},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "takes precedence over max_tokens"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
        "top_k": {"type": "integer", "minimum": 0, "default": 0},
        "seed": INT64,
        "stop": {"oneOf": [{"type": "string", "minLength": 1},
                           {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}}]},
        "stream": {"type": "boolean", "default": False},
        "logprobs": {"type": "boolean", "default": False},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20, "description": "needs logprobs: true"},
        "n": {"type": "integer", "minimum": 1, "maximum": 1},
        "presence_penalty": {"type": "number", "minimum": 0, "maximum": 0},
        "frequency_penalty": {"type": "number", "minimum": 0, "maximum": 0},
        "priority": {**INT64, "default": 0,
                     "description": "lower is served first (--scheduling-policy priority); other than 0 is a "
                                    "400 under fcfs"},
    },
}
LOGPROBS = {"type": ["object", "null"], "properties": {"content": {"type": "array", "items": {"type": "object"}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens",
                                                                      "total_tokens")}}
CHAT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": USAGE,
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {"index": {"type": "integer"}, "logprobs": LOGPROBS,
                           "finish_reason": {"enum": ["stop", "length"]},
                           "message": {"type": "object", "required": ["role", "content"],
                                       "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}}},
        }},
    },
}
HEALTH = {"type": "object", "required": ["status"],
          "properties": {"status": {"enum": ["ok", "loading", "draining", "dead"]}, "model": {"type": "string"},
                         "backend": {"type": "string"}, "quant": {"type": "string"},
                         "block_size": {"type": "integer"}, "kv_blocks_total": {"type": "integer"},
                         "max_batch": {"type": "integer"}}}
MODELS = {"type": "object", "required": ["object", "data"],
          "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
              "type": "object", "required": ["id", "object"],
              "properties": {"id": {"type": "string"}, "object": {"const": "model"}}}}}}
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
UNAVAILABLE = _error("loading, draining, the engine has stopped, or the request waited past --queue-timeout",
                     RETRY_AFTER)


def chat_request_schema(max_seq_len: int | None) -> dict[str, Any]:
    """The request schema, with this server's length limit on max_tokens (the prompt takes at
    least one of max_seq_len's tokens)."""
    if max_seq_len is None:
        return CHAT_REQUEST
    properties = dict(CHAT_REQUEST["properties"])
    for name in ("max_tokens", "max_completion_tokens"):
        properties[name] = {**properties[name], "maximum": max_seq_len - 1}
    return {**CHAT_REQUEST, "properties": properties}


def openapi_document(model: str | None, protected: bool, metrics_public: bool,
                     max_seq_len: int | None = None) -> dict[str, Any]:
    """protected: whether API keys guard the routes (all but /health and this document, and
    /metrics with metrics_public)."""
    secured = [{"bearer": []}] if protected else []
    open_ = {"security": []}
    unauthorized = {"401": _error("missing or wrong API key")} if protected else {}
    metrics_security = open_ if metrics_public else {"security": secured}
    metrics_auth = {} if metrics_public else unauthorized
    metrics_json = _json("the flat JSON figures (Prometheus text with Accept: text/plain)", {"type": "object"})
    metrics_json["content"]["text/plain"] = {"schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "qwen-serve", "version": "0.1.0",
                 "description": "OpenAI-compatible inference server" + (f" serving {model}" if model else "")},
        "security": secured,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR_SCHEMA, "ChatCompletionRequest": chat_request_schema(max_seq_len),
                        "ChatCompletion": CHAT_COMPLETION, "Health": HEALTH, "ModelList": MODELS},
        },
        "paths": {
            "/health": {"get": {**open_, "operationId": "health", "responses": {
                "200": _json("ready", {"$ref": "#/components/schemas/Health"}),
                "503": _json("loading, draining or dead", {"$ref": "#/components/schemas/Health"})}}},
            "/openapi.json": {"get": {**open_, "operationId": "openapi", "responses": {
                "200": _json("this document", {"type": "object"})}}},
            "/v1/models": {"get": {"operationId": "listModels", "responses": {
                "200": _json("the served model", {"$ref": "#/components/schemas/ModelList"}),
                **unauthorized, "503": UNAVAILABLE}}},
            "/v1/chat/completions": {"post": {
                "operationId": "createChatCompletion",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}},
                "responses": {
                    "200": {"description": "a completion, or with stream: true Server-Sent Events (chunks, "
                                           "`: keep-alive` comments while waiting, then `data: [DONE]`)",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
                    "400": _error("invalid request"), **unauthorized,
                    "404": _error("model not served"), "413": _error("request body too large"),
                    "429": _error("--max-queue requests are already waiting", RETRY_AFTER),
                    "500": _error("internal error while generating"), "503": UNAVAILABLE}}},
            "/metrics": {"get": {**metrics_security, "operationId": "metrics", "responses": {
                "200": metrics_json, **metrics_auth, "503": UNAVAILABLE}}},
            "/metrics/prometheus": {"get": {**metrics_security, "operationId": "metricsPrometheus", "responses": {
                "200": {"description": "Prometheus text exposition",
                        "content": {"text/plain": {"schema": {"type": "string"}}}},
                **metrics_auth, "503": UNAVAILABLE}}},
        },
    }
