"""The OpenAPI paths of the Responses and Anthropic Messages routes, for ``openapi.document``.

Their bodies are translated by hand (``api.responses.request``, ``api.anthropic.request``), not
validated by a pydantic model, so the request schemas are written here: the fields each route
checks the type of, and the required ones. The Anthropic routes answer errors in Anthropic's shape (the gate's
401 / 413 / 503 keep llama-server's).
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"
SSE = "text/event-stream"


def _nullable(kind: str) -> dict:
    return {"type": [kind, "null"]}


RESPONSES_REQUEST = {
    "type": "object", "required": ["input"],
    "properties": {
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": _nullable("string"), "previous_response_id": _nullable("string"),
        "max_output_tokens": _nullable("integer"), "max_tool_calls": _nullable("integer"),
        "store": _nullable("boolean"), "background": _nullable("boolean"), "stream": _nullable("boolean"),
        "metadata": _nullable("object"), "reasoning": _nullable("object"), "text": _nullable("object"),
        "include": {"type": ["array", "null"], "items": {"type": "string"}},
        "tools": {"type": ["array", "null"], "items": {"type": "object"}},
        "temperature": _nullable("number"), "top_p": _nullable("number"),
    },
}
MESSAGES_REQUEST = {
    "type": "object", "required": ["messages", "max_tokens"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["user", "assistant"]},
                           "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}}}},
        "max_tokens": {"type": "integer", "minimum": 1},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"}, "temperature": {"type": "number"}, "top_p": {"type": "number"},
        "top_k": {"type": "integer"}, "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"type": "object"}, "thinking": {"type": "object"},
    },
}
COUNT_REQUEST = {**MESSAGES_REQUEST, "required": ["messages"]}

RESPONSE = {"type": "object", "required": ["id", "object", "created_at", "status", "output"],
            "properties": {"object": {"const": "response"}, "output": {"type": "array"},
                           "status": {"enum": ["queued", "in_progress", "completed", "incomplete", "failed",
                                               "cancelled"]}}}
MESSAGE = {"type": "object", "required": ["id", "type", "role", "content", "stop_reason", "usage"],
           "properties": {"type": {"const": "message"}, "role": {"const": "assistant"}, "content": {"type": "array"},
                          "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}}}
ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"],
                   "properties": {"type": {"const": "error"}, "error": {
                       "type": "object", "required": ["type", "message"],
                       "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}


def _errors(schema: dict, statuses: tuple[int, ...]) -> dict:
    return {str(s): {"description": "error", "content": {JSON: {"schema": schema}}} for s in statuses}


def _operation(summary: str, body: dict | None, ok: dict, error: dict, statuses: tuple[int, ...],
               stream: bool = False, path_id: bool = False) -> dict:
    content = {JSON: {"schema": ok}, **({SSE: {"schema": {}}} if stream else {})}  # named events: any shape
    op: dict[str, Any] = {"summary": summary,
                          "responses": {"200": {"description": "ok", "content": content}, **_errors(error, statuses)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    if path_id:
        op["parameters"] = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return op


def paths(error: dict) -> dict[str, Any]:
    """The paths, given llama-server's error schema."""
    either = {"anyOf": [ANTHROPIC_ERROR, error]}
    tokens = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}}
    by_id = (400, 401, 404, 503)
    return {
        "/v1/responses": {"post": _operation("OpenAI Responses: create", RESPONSES_REQUEST, RESPONSE, error,
                                             (400, 401, 404, 408, 413, 500, 503), stream=True)},
        "/v1/responses/input_tokens": {"post": _operation("OpenAI Responses: prompt size", RESPONSES_REQUEST, tokens,
                                                          error, (400, 401, 404, 408, 413, 503))},
        "/v1/responses/{response_id}": {
            "get": _operation("OpenAI Responses: a stored response", None, RESPONSE, error, by_id, path_id=True),
            "delete": _operation("OpenAI Responses: delete a stored response", None, {"type": "object"}, error, by_id,
                                 path_id=True)},
        "/v1/responses/{response_id}/cancel": {
            "post": _operation("OpenAI Responses: cancel a background response", None, RESPONSE, error, by_id,
                               path_id=True)},
        "/v1/messages": {"post": _operation("Anthropic Messages: create", MESSAGES_REQUEST, MESSAGE, either,
                                            (400, 401, 404, 408, 413, 500, 503), stream=True)},
        "/v1/messages/count_tokens": {"post": _operation("Anthropic Messages: prompt size", COUNT_REQUEST, tokens,
                                                         either, (400, 401, 404, 408, 413, 503))},
    }
