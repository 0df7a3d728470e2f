"""GET /openapi.json: an OpenAPI 3.1 description of the routes this server serves, its request
schemas generated from the models qwen_serve.openai.protocol validates with (a fuzz test drives
the live server from it: tests/test_server_fuzz.py). Built per server, so its security section says which
routes this server's --api-key / --metrics-public protect."""
from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from ..anthropic.protocol import CountTokensRequest, MessagesRequest
from ..openai.pooling_protocol import EmbeddingRequest, RerankRequest, ScoreRequest
from ..openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from ..responses.protocol import ResponsesRequest

REQUESTS = (ChatCompletionRequest, CompletionRequest, TokenizeRequest, DetokenizeRequest, MessagesRequest,
            CountTokensRequest, ResponsesRequest, EmbeddingRequest, RerankRequest, ScoreRequest)
REF = "#/components/schemas/{model}"
ERROR = {"$ref": "#/components/schemas/Error"}
ANTHROPIC_ERROR = {"$ref": "#/components/schemas/AnthropicError"}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def _error(description: str, headers: dict | None = None, schema: dict[str, Any] = ERROR) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


SSE_EVENT = {"type": "object", "required": ["data"], "description": "each event's data is a chunk as JSON, the "
             "last one [DONE]", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
NONNEGATIVE_INT = {"type": "integer", "minimum": 0}
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
ANTHROPIC_ERROR_SCHEMA = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string"}, "message": {"type": "string"}}}}}
CONTENT_BLOCK = {"type": "object", "required": ["type"], "properties": {
    "type": {"enum": ["thinking", "text", "tool_use"]}, "thinking": {"type": "string"},
    "signature": {"type": "string"}, "text": {"type": "string"}, "id": {"type": "string"},
    "name": {"type": "string"}, "input": {"type": "object"}}}
MESSAGE = {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
           "properties": {"id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                          "model": {"type": "string"}, "content": {"type": "array", "items": CONTENT_BLOCK},
                          "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
                          "stop_sequence": {"type": ["string", "null"]},
                          "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                                    "properties": {k: NONNEGATIVE_INT for k in (
                                        "input_tokens", "output_tokens", "cache_read_input_tokens",
                                        "cache_creation_input_tokens")}}}}
OUTPUT_ITEM = {"type": "object", "required": ["type", "id", "status"], "properties": {
    "type": {"enum": ["reasoning", "message", "function_call"]}, "id": {"type": "string"},
    "status": {"enum": ["in_progress", "completed", "incomplete"]}, "role": {"const": "assistant"},
    "content": {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"enum": ["reasoning_text", "output_text"]}, "text": {"type": "string"}}}},
    "summary": {"type": "array"}, "encrypted_content": {"type": "string"}, "call_id": {"type": "string"},
    "name": {"type": "string"}, "arguments": {"type": "string"}}}
RESPONSE_USAGE = {"type": "object", "required": ["input_tokens", "input_tokens_details", "output_tokens",
                                                 "output_tokens_details", "total_tokens"], "properties": {
    "input_tokens": NONNEGATIVE_INT, "output_tokens": NONNEGATIVE_INT, "total_tokens": NONNEGATIVE_INT,
    "input_tokens_details": {"type": "object", "required": ["cached_tokens"],
                             "properties": {"cached_tokens": NONNEGATIVE_INT, "cache_write_tokens": NONNEGATIVE_INT}},
    "output_tokens_details": {"type": "object", "required": ["reasoning_tokens"],
                              "properties": {"reasoning_tokens": NONNEGATIVE_INT}}}}
RESPONSE = {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                           "created_at": {"type": "integer"}, "model": {"type": "string"},
                           "status": {"enum": ["completed", "incomplete", "failed"]},
                           "incomplete_details": {"type": ["object", "null"]}, "error": {"type": ["object", "null"]},
                           "output": {"type": "array", "items": OUTPUT_ITEM}, "usage": RESPONSE_USAGE,
                           "previous_response_id": {"type": ["string", "null"]}, "store": {"type": "boolean"}}}
RESPONSE_DELETED = {"type": "object", "required": ["id", "object", "deleted"], "properties": {
    "id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}}
POOLING_USAGE = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                 "properties": {"prompt_tokens": NONNEGATIVE_INT, "total_tokens": NONNEGATIVE_INT}}
EMBEDDINGS = {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
    "object": {"const": "list"}, "model": {"type": "string"}, "usage": POOLING_USAGE,
    "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
        "object": {"const": "embedding"}, "index": NONNEGATIVE_INT,
        "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}},
                                {"type": "string", "description": "base64 of little-endian float32"}]}}}}}}
RERANKED = {"type": "object", "required": ["id", "model", "results", "usage"], "properties": {
    "id": {"type": "string"}, "model": {"type": "string"}, "usage": POOLING_USAGE,
    "results": {"type": "array", "description": "best first", "items": {
        "type": "object", "required": ["index", "relevance_score"], "properties": {
            "index": NONNEGATIVE_INT, "relevance_score": {"type": "number", "minimum": 0, "maximum": 1},
            "document": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}}}}}}
SCORES = {"type": "object", "required": ["id", "object", "created", "model", "data", "usage"], "properties": {
    "id": {"type": "string"}, "object": {"const": "list"}, "created": {"type": "integer"},
    "model": {"type": "string"}, "usage": POOLING_USAGE,
    "data": {"type": "array", "items": {"type": "object", "required": ["index", "object", "score"], "properties": {
        "index": NONNEGATIVE_INT, "object": {"const": "score"}, "score": {"type": "number", "minimum": 0, "maximum": 1}}}}}}
TOKEN_COUNT = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": NONNEGATIVE_INT}}
UNAVAILABLE = _error("loading, draining, the engine has stopped, or the request waited past --queue-timeout",
                     RETRY_AFTER)


def request_schemas(max_seq_len: int | None) -> dict[str, Any]:
    """Every request body's schema and the schemas they refer to, from the models in
    qwen_serve.openai.protocol, as this server reads them: an optional field may be null (null
    means omitted), and max_tokens has this server's length limit (the prompt takes at least one
    of max_seq_len's tokens)."""
    _, top = models_json_schema([(model, "validation") for model in REQUESTS], ref_template=REF)
    schemas = {name: null_means_omitted(schema) for name, schema in top["$defs"].items()}
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        for field in ("max_tokens", "max_completion_tokens"):
            if max_seq_len is not None and field in schemas[name]["properties"]:
                schemas[name]["properties"][field]["anyOf"][0]["maximum"] = max_seq_len - 1
    return schemas


def null_means_omitted(schema: Any) -> Any:
    """``schema`` with every optional property, at any depth, also allowed to be null."""
    if isinstance(schema, list):
        return [null_means_omitted(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: null_means_omitted(value) for key, value in schema.items()}
    if "properties" in schema:
        required = set(schema.get("required", ()))
        out["properties"] = {name: field if name in required or _nullable(field)
                             else {"anyOf": [field, {"type": "null"}]} for name, field in out["properties"].items()}
    return out


def _nullable(field: dict[str, Any]) -> bool:
    return field.get("type") == "null" or {"type": "null"} in field.get("anyOf", ())


def _generating(operation_id: str, request: str, response: str, unauthorized: dict,
                error: dict[str, Any] = ERROR, end: str = "then `data: [DONE]`",
                not_found: str = "model not served") -> dict[str, Any]:
    def failed(description: str, headers: dict | None = None) -> dict[str, Any]:
        return _error(description, headers, error)

    return {"post": {
        "operationId": operation_id,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {
            "200": {"description": "a reply, or with stream: true Server-Sent Events (events, "
                                   f"`: keep-alive` comments while waiting, {end})",
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{response}"}},
                                "text/event-stream": {"schema": SSE_EVENT}}},
            "400": failed("invalid request"), **unauthorized,
            "404": failed(not_found), "413": failed("request body too large"),
            "429": failed("--max-queue requests are already waiting", RETRY_AFTER),
            "500": failed("internal error while generating"),
            "503": failed(UNAVAILABLE["description"], RETRY_AFTER)}}}


def _tokenizing(operation_id: str, request: str, response: dict[str, Any], unauthorized: dict,
                error: dict[str, Any] = ERROR) -> dict[str, Any]:
    return {"post": {
        "operationId": operation_id,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}},
        "responses": {"200": _json("the result", response), "400": _error("invalid request", schema=error),
                      **unauthorized, "404": _error("model not served", schema=error),
                      "413": _error("request body too large", schema=error),
                      "503": _error(UNAVAILABLE["description"], RETRY_AFTER, error)}}}


def _pooling(operation_id: str, request: str, response: dict[str, Any], unauthorized: dict) -> dict[str, Any]:
    """A route served by --task embed or rerank (a 400 on a server of another task)."""
    operation = _tokenizing(operation_id, request, response, unauthorized)
    responses = operation["post"]["responses"]
    responses["400"] = _error("invalid request, or a route this server's --task does not serve")
    responses["429"] = _error("--max-queue requests are already waiting", RETRY_AFTER)
    responses["500"] = _error("internal error while computing")
    return operation


def _stored_response(unauthorized: dict) -> dict[str, Any]:
    """GET and DELETE /v1/responses/{response_id}."""
    parameters = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    missing = _error("no such response stored (never, not with store: true, deleted, or evicted)")
    return {method: {"operationId": operation_id, "parameters": parameters, "responses": {
        "200": _json(description, schema), **unauthorized, "404": missing, "503": UNAVAILABLE}}
        for method, operation_id, description, schema in (
            ("get", "getResponse", "the stored response", {"$ref": "#/components/schemas/ResponseObject"}),
            ("delete", "deleteResponse", "deleted", RESPONSE_DELETED))}


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
    anthropic_unauthorized = {"401": _error("missing or wrong API key", schema=ANTHROPIC_ERROR)} if protected else {}
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
                        "ChatCompletion": CHAT_COMPLETION, "Completion": COMPLETION,
                        "AnthropicError": ANTHROPIC_ERROR_SCHEMA, "AnthropicMessage": MESSAGE,
                        "ResponseObject": RESPONSE,
                        "TokenId": token_id_schema(vocab_size), **request_schemas(max_seq_len)},
        },
        "paths": {
            "/": {"get": {**open_, "operationId": "root", "responses": {
                "200": _json("where to look next", {"type": "object"})}}},
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
            "/v1/messages": _generating("createMessage", "MessagesRequest", "AnthropicMessage", anthropic_unauthorized,
                                        ANTHROPIC_ERROR, "then `message_stop`"),
            "/v1/messages/count_tokens": _tokenizing("countMessageTokens", "CountTokensRequest", TOKEN_COUNT,
                                                     anthropic_unauthorized, ANTHROPIC_ERROR),
            "/v1/responses": _generating("createResponse", "ResponsesRequest", "ResponseObject", unauthorized,
                                         end="then `response.completed`, `response.incomplete` or "
                                             "`response.failed`",
                                         not_found="previous_response_id is not stored"),
            "/v1/responses/{response_id}": _stored_response(unauthorized),
            "/v1/embeddings": _pooling("createEmbedding", "EmbeddingRequest", EMBEDDINGS, unauthorized),
            "/v1/rerank": _pooling("rerank", "RerankRequest", RERANKED, unauthorized),
            "/v1/score": _pooling("score", "ScoreRequest", SCORES, unauthorized),
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
