"""The server's OpenAPI 3.1 document (``GET /openapi.json``): every route mlxcel implements, with
request bodies taken from the pydantic models the routes validate with (``schema.py``) and the
response bodies and error shapes they send. Routes that need a flag or a capable model (``/infill``
without FIM tokens, embeddings, rerank, slot files) answer 501 on the plain server the fuzz tests
start, so they are left out; their own tests cover them.

The routes read raw bodies (to answer malformed JSON with upstream's messages), so FastAPI cannot
derive this document itself; it is written here, and ``tests/server/http/test_fuzz.py`` holds the live
server to it with schemathesis (``make fuzz`` for the long run).
"""

from __future__ import annotations

from typing import Any

from mlxcel.server.http.api.server_info import openapi_apis
from mlxcel.server.http.schema import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from mlxcel.server.runtime.errors import ERROR_STATUS

JSON = "application/json"
SSE = "text/event-stream"

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message", "type"],
        "properties": {
            "code": {"type": "integer"},
            "message": {"type": "string"},
            "type": {"type": "string", "enum": sorted(ERROR_STATUS)},
            "n_prompt_tokens": {"type": "integer"},
            "n_ctx": {"type": "integer"},
        },
    }},
}
NOT_FOUND = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message", "type"],
    "properties": {"code": {"const": 404}, "message": {"type": "string"}, "type": {"const": "not_found_error"}}}}}

TIMINGS = {"type": "object", "required": ["cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"],
           "properties": {k: {"type": "number"} for k in (
               "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
               "predicted_ms", "predicted_per_token_ms", "predicted_per_second")}}
NATIVE = {"type": "object",
          "required": ["index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
                       "tokens_evaluated", "stop_type", "timings"],
          "properties": {"index": {"type": "integer"}, "content": {"type": "string"},
                         "tokens": {"type": "array", "items": {"type": "integer"}}, "stop": {"type": "boolean"},
                         "tokens_predicted": {"type": "integer"}, "tokens_evaluated": {"type": "integer"},
                         "stop_type": {"enum": ["eos", "limit", "word", "none"]}, "timings": TIMINGS}}
USAGE = {"type": "object", "required": ["completion_tokens", "prompt_tokens", "total_tokens"],
         "properties": {k: {"type": "integer"} for k in ("completion_tokens", "prompt_tokens", "total_tokens")}}
OAI_COMPLETION = {"type": "object", "required": ["choices", "created", "model", "object", "usage"],
                  "properties": {"object": {"const": "text_completion"}, "usage": USAGE, "choices": {
                      "type": "array", "minItems": 1, "items": {
                          "type": "object", "required": ["text", "index", "finish_reason"],
                          "properties": {"text": {"type": "string"}, "index": {"type": "integer"},
                                         "finish_reason": {"enum": ["stop", "length"]}}}}}}
CHAT = {"type": "object", "required": ["choices", "created", "model", "object", "usage", "timings"],
        "properties": {"object": {"const": "chat.completion"}, "usage": USAGE, "timings": TIMINGS, "choices": {
            "type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["index", "message", "finish_reason"],
                "properties": {"index": {"type": "integer"}, "finish_reason": {"enum": ["stop", "length"]},
                               "message": {"type": "object", "required": ["role", "content"],
                                           "properties": {"role": {"const": "assistant"},
                                                          "content": {"type": ["string", "null"]}}}}}}}}
OBJECT = {"type": "object"}


def _body_schema(model, required: list[str]) -> dict:
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    if required:
        schema["required"] = required
    return schema


def _errors(*statuses: int) -> dict:
    out = {}
    for status in statuses:
        schema = NOT_FOUND if status == 404 else ERROR
        out[str(status)] = {"description": "error", "content": {JSON: {"schema": schema}}}
    return out


def _post(summary: str, body_ref: str, ok: dict, stream: bool) -> dict:
    content = {JSON: {"schema": ok}}
    if stream:
        content[SSE] = {"schema": {"type": "string"}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{body_ref}"}}}},
        "responses": {"200": {"description": "the result (an SSE stream when stream is true)", "content": content},
                      **_errors(400, 401, 408, 413, 500, 503)},
    }}


def _get(summary: str, ok: dict, *errors: int) -> dict:
    return {"get": {"summary": summary,
                    "responses": {"200": {"description": "ok", "content": {JSON: {"schema": ok}}},
                                  **_errors(401, *errors)}}}


def document() -> dict[str, Any]:
    native_ok = {"anyOf": [NATIVE, {"type": "array", "items": NATIVE}]}
    paths = {
        "/health": _get("liveness", {"type": "object", "required": ["status"], "properties": {
            "status": {"const": "ok"}}}, 503),
        "/v1/health": _get("liveness (alias)", {"type": "object", "required": ["status"]}, 503),
        "/props": _get("server properties", OBJECT, 503),
        "/models": _get("the served model", OBJECT, 503),
        "/v1/models": _get("the served model (alias)", OBJECT, 503),
        "/slots": _get("slot states", {"type": "array", "items": OBJECT}, 501, 503),
        "/lora-adapters": _get("loaded LoRA adapters and their global scales", {"type": "array", "items": {
            "type": "object", "required": ["id", "path", "scale", "task_name", "prompt_prefix"],
            "properties": {"id": {"type": "integer"}, "path": {"type": "string"}, "scale": {"type": "number"},
                           "task_name": {"type": "string"}, "prompt_prefix": {"type": "string"}}}}, 503),
        "/completion": _post("native completion", "CompletionRequest", native_ok, True),
        "/completions": _post("native completion (alias)", "CompletionRequest", native_ok, True),
        "/v1/completions": _post("OpenAI completion", "CompletionRequest", OAI_COMPLETION, True),
        "/v1/chat/completions": _post("OpenAI chat completion", "ChatRequest", CHAT, True),
        "/chat/completions": _post("OpenAI chat completion (alias)", "ChatRequest", CHAT, True),
        "/tokenize": _post("text to token ids", "TokenizeRequest", {
            "type": "object", "required": ["tokens"], "properties": {"tokens": {"type": "array"}}}, False),
        "/detokenize": _post("token ids to text", "DetokenizeRequest", {
            "type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}, False),
        "/apply-template": _post("chat messages to prompt text", "ChatRequest", {
            "type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}, False),
        "/v1/chat/completions/input_tokens": _post("prompt size of chat messages", "ChatRequest", {
            "type": "object", "required": ["input_tokens", "object"],
            "properties": {"input_tokens": {"type": "integer"}}}, False),
    }
    paths.update(openapi_apis.paths(ERROR))  # the Responses and Anthropic Messages routes
    return {
        "openapi": "3.1.0",
        "info": {"title": "mlxcel-server", "version": "1",
                 "description": "llama-server compatible API served by mlxcel (MLX)"},
        "paths": paths,
        "components": {"schemas": {
            "CompletionRequest": _body_schema(CompletionRequest, ["prompt"]),
            "ChatRequest": _body_schema(ChatRequest, ["messages"]),
            "TokenizeRequest": _body_schema(TokenizeRequest, []),
            "DetokenizeRequest": _body_schema(DetokenizeRequest, []),
            "Error": ERROR,
        }},
    }
