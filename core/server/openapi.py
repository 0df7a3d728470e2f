"""GET /openapi.json: an OpenAPI 3.1 description of the routes this server serves, with the
request schema that qwen_serve.openai.protocol enforces (a fuzz test drives the live server
from it: tests/test_server_fuzz.py). Built per server, so its security section says which
routes this server's --api-key / --metrics-public protect."""
from __future__ import annotations

from typing import Any

from ..chat.messages import ROLES
from ..chat.tools import NAME as TOOL_NAME
from ..openai.protocol import DEFAULT_COMPLETION_MAX_TOKENS, DEFAULT_MAX_TOKENS, REASONING_EFFORTS
from ..openai.sampling_fields import MAX_N, MAX_STOPS

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
CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]}
TOOL_CALL = {"type": "object", "required": ["id", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"type": "string", "minLength": 1},
        "arguments": {"type": "string", "description": "a JSON object as a string"}}}}}
MESSAGE = {"anyOf": [  # by role, as qwen_serve.chat.messages reads them
    {"type": "object", "required": ["role", "content"],
     "properties": {"role": {"enum": [r for r in ROLES if r not in ("assistant", "tool")]}, "content": CONTENT,
                    "name": {"type": "string"}, "tool_calls": {"type": "null"}}},
    {"type": "object", "required": ["role", "content"],
     "properties": {"role": {"const": "assistant"}, "content": CONTENT,
                    "tool_calls": {"type": "array", "items": TOOL_CALL},
                    "reasoning_content": {"type": "string"}, "name": {"type": "string"}}},
    {"type": "object", "required": ["role", "tool_calls"],
     "properties": {"role": {"const": "assistant"}, "content": {"type": "null"},
                    "tool_calls": {"type": "array", "minItems": 1, "items": TOOL_CALL},
                    "reasoning_content": {"type": "string"}, "name": {"type": "string"}}},
    {"type": "object", "required": ["role", "content", "tool_call_id"],
     "properties": {"role": {"const": "tool"}, "content": CONTENT, "tool_call_id": {"type": "string"},
                    "name": {"type": "string"}, "tool_calls": {"type": "null"}}},
]}
TOKEN_ID = {"$ref": "#/components/schemas/TokenId"}  # bounded by this server's vocabulary (token_id_schema)
TOKEN_IDS = {"type": "array", "minItems": 1, "items": TOKEN_ID}
NONNEGATIVE_INT = {"type": "integer", "minimum": 0}
DEFAULT_FITS = "omitted: the default, or fewer when the prompt leaves less room under the maximum sequence length"
SAMPLING = {  # the fields chat and legacy completions share (qwen_serve.openai.sampling_fields)
    "model": {"type": "string", "description": "optional; a name this server does not serve is a 404"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
    "top_k": {"type": "integer", "minimum": 0, "default": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
    "seed": INT64,
    "stop": {"oneOf": [{"type": "string", "minLength": 1},
                       {"type": "array", "maxItems": MAX_STOPS, "items": {"type": "string", "minLength": 1}}]},
    "stop_token_ids": {"type": "array", "items": TOKEN_ID},
    "min_tokens": {**NONNEGATIVE_INT, "default": 0, "description": "at most max_tokens"},
    "ignore_eos": {"type": "boolean", "default": False},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N, "default": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "default": 1},
    "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "vllm_xargs": {"type": "object", "description": "arguments for plugins (vLLM's name): each name must be "
                   "taken by a logits processor this server loaded, which checks its value"},
    "stream": {"type": "boolean", "default": False},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                       "description": "only with stream: true"},
    "priority": {**INT64, "default": 0,
                 "description": "lower is served first (--scheduling-policy priority); other than 0 is a "
                                "400 under fcfs"},
}
SSE_EVENT = {"type": "object", "required": ["data"], "description": "each event's data is a chunk as JSON, the "
             "last one [DONE]", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


def _needs(field: str, kind: str, other: str) -> dict[str, Any]:
    """``field`` given (not null) needs ``other`` to be true."""
    return {"if": {"required": [field], "properties": {field: {"type": kind}}},
            "then": {"required": [other], "properties": {other: {"const": True}}}}


STREAM_OPTIONS_NEED_STREAM = _needs("stream_options", "object", "stream")
TOOL = {"type": "object", "required": ["type", "function"],
        "properties": {"type": {"const": "function"}, "function": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": f"^{TOOL_NAME.pattern}$"},
                           "description": {"type": "string"},
                           "parameters": {"type": "object", "description": "a JSON Schema"}}}}}
CHAT_REQUEST = {
    "type": "object", "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "max_tokens": {"type": "integer", "minimum": 1, "default": DEFAULT_MAX_TOKENS, "description": DEFAULT_FITS},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "takes precedence over max_tokens"},
        **SAMPLING,
        "logprobs": {"type": "boolean", "default": False},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20, "description": "needs logprobs: true"},
        "tools": {"type": "array", "items": TOOL},
        "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"const": "function"}, "function": {
                "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]},
        "response_format": {"oneOf": [
            {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
            {"type": "object", "required": ["type", "json_schema"], "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {"type": "object", "required": ["name", "schema"], "properties": {
                    "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}}}]},
        "chat_template_kwargs": {"type": "object", "description": "e.g. {\"enable_thinking\": false}"},
        "reasoning_effort": {"enum": list(REASONING_EFFORTS), "description": "none: enable_thinking false"},
    },
    "allOf": [STREAM_OPTIONS_NEED_STREAM, _needs("top_logprobs", "integer", "logprobs")],
}
PROMPT_TEXT = {"type": "string", "minLength": 1}  # an empty prompt is a 400
COMPLETION_REQUEST = {
    "type": "object", "required": ["prompt"],
    "properties": {
        "prompt": {"oneOf": [PROMPT_TEXT, {"type": "array", "minItems": 1, "items": PROMPT_TEXT},
                             TOKEN_IDS, {"type": "array", "minItems": 1, "items": TOKEN_IDS}]},
        "max_tokens": {"type": "integer", "minimum": 1, "default": DEFAULT_COMPLETION_MAX_TOKENS,
                       "description": DEFAULT_FITS},
        **SAMPLING,
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "best_of": {"type": "integer", "minimum": 1, "description": "only equal to n"},
    },
    "allOf": [STREAM_OPTIONS_NEED_STREAM],
}
TOKENIZE_REQUEST = {
    "type": "object", "description": "either prompt or messages",
    "oneOf": [{"required": [name], "properties": {name: {"type": kind}}}
              for name, kind in (("prompt", "string"), ("messages", "array"))],
    "properties": {
        "model": SAMPLING["model"],
        "prompt": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "tools": {"type": "array", "items": TOOL},
        "chat_template_kwargs": {"type": "object"},
        "add_special_tokens": {"type": "boolean"},
        "add_generation_prompt": {"type": "boolean", "default": True},
        "return_token_strs": {"type": "boolean", "default": False},
    },
}
DETOKENIZE_REQUEST = {"type": "object", "required": ["tokens"],
                      "properties": {"model": SAMPLING["model"], "tokens": {"type": "array", "items": TOKEN_ID}}}
LOGPROBS = {"type": ["object", "null"]}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens",
                                                                      "total_tokens")}}
FINISH_REASON = {"enum": ["stop", "length", "tool_calls"]}


def _reply(object_name: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"const": object_name}, "created": {"type": "integer"},
                           "model": {"type": "string"}, "usage": USAGE,
                           "choices": {"type": "array", "items": choice}}}


CHAT_COMPLETION = _reply("chat.completion", {
    "type": "object", "required": ["index", "message", "finish_reason"],
    "properties": {"index": {"type": "integer"}, "logprobs": LOGPROBS, "finish_reason": FINISH_REASON,
                   "message": {"type": "object", "required": ["role", "content"], "properties": {
                       "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                       "reasoning_content": {"type": ["string", "null"]},
                       "tool_calls": {"type": "array", "items": {"type": "object"}}}}}})
COMPLETION = _reply("text_completion", {
    "type": "object", "required": ["index", "text", "finish_reason"],
    "properties": {"index": {"type": "integer"}, "text": {"type": "string"}, "logprobs": LOGPROBS,
                   "finish_reason": FINISH_REASON}})
TOKENIZED = {"type": "object", "required": ["tokens", "count"],
             "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}, "count": NONNEGATIVE_INT,
                            "max_model_len": {"type": ["integer", "null"]},
                            "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}}
DETOKENIZED = {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}
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


def request_schema(schema: dict[str, Any], max_seq_len: int | None = None) -> dict[str, Any]:
    """A request's schema as this server reads it: an optional field may be null (null means
    omitted, as OpenAI's own schema allows), and max_tokens has this server's length limit (the
    prompt takes at least one of max_seq_len's tokens)."""
    properties = dict(schema["properties"])
    if max_seq_len is not None:
        for name in ("max_tokens", "max_completion_tokens"):
            if name in properties:
                properties[name] = {**properties[name], "maximum": max_seq_len - 1}
    return null_means_omitted({**schema, "properties": properties})


def null_means_omitted(schema: Any) -> Any:
    """``schema`` with every optional property, at any depth, also allowed to be null: the
    protocol's readers take a null as the field left out. (An ``if`` is a condition on a given
    value, so it is left as it is.)"""
    if isinstance(schema, list):
        return [null_means_omitted(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key == "if" else null_means_omitted(value) for key, value in schema.items()
           if key != "properties"}
    if "properties" in schema:
        required = set(schema.get("required", ()))
        out["properties"] = {name: null_means_omitted(field) if name in required
                             else {"anyOf": [null_means_omitted(field), {"type": "null"}]}
                             for name, field in schema["properties"].items()}
    return out


def _generating(operation_id: str, request: str, response: str, unauthorized: dict) -> dict[str, Any]:
    return {"post": {
        "operationId": operation_id,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {
            "200": {"description": "a reply, or with stream: true Server-Sent Events (chunks, "
                                   "`: keep-alive` comments while waiting, then `data: [DONE]`)",
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response}"}},
                                "text/event-stream": {"schema": SSE_EVENT}}},
            "400": _error("invalid request"), **unauthorized,
            "404": _error("model not served"), "413": _error("request body too large"),
            "429": _error("--max-queue requests are already waiting", RETRY_AFTER),
            "500": _error("internal error while generating"), "503": UNAVAILABLE}}}


def _tokenizing(operation_id: str, request: str, response: dict[str, Any], unauthorized: dict) -> dict[str, Any]:
    return {"post": {
        "operationId": operation_id,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {"200": _json("the result", response), "400": _error("invalid request"), **unauthorized,
                      "404": _error("model not served"), "413": _error("request body too large"),
                      "503": UNAVAILABLE}}}


def token_id_schema(vocab_size: int | None) -> dict[str, Any]:
    if vocab_size is None:
        return {"type": "integer", "minimum": 0, "description": "below the vocabulary size"}
    return {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}


def openapi_document(model: str | None, protected: bool, metrics_public: bool,
                     max_seq_len: int | None = None, vocab_size: int | None = None) -> dict[str, Any]:
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
            "schemas": {"Error": ERROR_SCHEMA, "Health": HEALTH, "ModelList": MODELS,
                        "ChatCompletionRequest": request_schema(CHAT_REQUEST, max_seq_len),
                        "ChatCompletion": CHAT_COMPLETION,
                        "CompletionRequest": request_schema(COMPLETION_REQUEST, max_seq_len),
                        "Completion": COMPLETION, "TokenizeRequest": request_schema(TOKENIZE_REQUEST),
                        "DetokenizeRequest": request_schema(DETOKENIZE_REQUEST), "TokenId": token_id_schema(vocab_size)},
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
            "/v1/chat/completions": _generating("createChatCompletion", "ChatCompletionRequest", "ChatCompletion",
                                                unauthorized),
            "/v1/completions": _generating("createCompletion", "CompletionRequest", "Completion", unauthorized),
            "/tokenize": _tokenizing("tokenize", "TokenizeRequest", TOKENIZED, unauthorized),
            "/detokenize": _tokenizing("detokenize", "DetokenizeRequest", DETOKENIZED, unauthorized),
            "/metrics": {"get": {**metrics_security, "operationId": "metrics", "responses": {
                "200": metrics_json, **metrics_auth, "503": UNAVAILABLE}}},
            "/metrics/prometheus": {"get": {**metrics_security, "operationId": "metricsPrometheus", "responses": {
                "200": {"description": "Prometheus text exposition",
                        "content": {"text/plain": {"schema": {"type": "string"}}}},
                **metrics_auth, "503": UNAVAILABLE}}},
        },
    }
