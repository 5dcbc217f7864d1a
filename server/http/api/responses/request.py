"""An OpenAI Responses request (``POST /v1/responses``) translated into the chat request the one
completion pipeline runs, and what its response format keeps of it.

As upstream: ``instructions`` become a system message, ``input`` (a string, or items) the
messages, function ``tools`` the chat tools, ``max_output_tokens`` ``max_tokens``,
``reasoning.effort`` ``reasoning_effort``; every other field goes through to the chat request, so
llama-server's sampling fields (``top_k``, ``seed``, ``timings_per_token``...) work here too.
Input items: messages (string content or ``input_text`` / ``output_text`` / ``refusal`` parts),
``function_call``, ``function_call_output`` and ``reasoning`` items; consecutive assistant items
(reasoning, message, calls) become one assistant message, as the template takes a turn.

Beyond upstream, as the official API: ``previous_response_id`` continues a stored response's
conversation (its instructions are not carried over); ``store`` (default true) keeps the response
for that and for ``GET``; ``tool_choice`` in the Responses shape (a named function,
``allowed_tools``); ``text.format`` becomes ``response_format``; ``include:
["reasoning.encrypted_content"]`` carries the reasoning in the item's ``encrypted_content`` (not
encrypted: this server keeps no secret from its own client) so a client that does not store
(``store: false``) can hand it back. What cannot be honoured is refused with a 400 that says so.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, field
from typing import Any

from mlxcel.server.http.body_fields import typed
from mlxcel.server.http.formats.ids import new_id
from mlxcel.server.http.response_store import ResponseStore
from mlxcel.server.http.schema import INT_MAX, check_range
from mlxcel.server.runtime.errors import ApiError, invalid, json_type_name

log = logging.getLogger(__name__)
ENCRYPTED_PREFIX = "mlxcel-reasoning:"  # the encrypted_content this server writes: base64 of the text
FILE_REFUSAL = "'input_file' is not supported by llamacpp at this moment"  # upstream's words
INCLUDES = ("reasoning.encrypted_content",)
# Responses fields that have no chat counterpart; what is honoured is read before they are dropped
_CONSUMED = ("input", "instructions", "tools", "tool_choice", "max_output_tokens", "reasoning", "text", "store",
             "background", "metadata", "include", "previous_response_id", "truncation", "user", "service_tier",
             "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "stream_options", "max_tool_calls",
             "top_logprobs", "conversation", "prompt", "messages")


@dataclass
class ResponsesRequest:
    """What the Responses format keeps of a request, to shape, store and echo its response."""

    id: str
    conversation: list[dict]  # chat messages: the previous response's, then this input (no instructions)
    instructions: str | None = None
    tools: list[dict] = field(default_factory=list)  # the function tools, in the Responses shape (echoed)
    tool_choice: Any = "auto"
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict = field(default_factory=dict)
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    reasoning_effort: str | None = None
    text: dict = field(default_factory=lambda: {"format": {"type": "text"}})
    user: str | None = None
    include_encrypted: bool = False


def not_found(response_id: str) -> ApiError:
    return ApiError(f"Response with id '{response_id}' not found.", "not_found_error")


def _text_parts(content: Any, where: str, *, output: bool) -> list[dict]:
    """Message content (a string or parts) as chat content parts: text, and (input only) an
    ``input_image``'s ``image_url`` as a chat ``image_url`` part, as upstream translates it (the chat plan
    reads the image, or refuses it on a text model)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}: 'content' must be a string or an array of content parts")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}: a '{kind}' part requires 'text' (a string)")
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and output:
            if not isinstance(part.get("refusal"), str):
                raise invalid(f"{where}: a 'refusal' part requires 'refusal' (a string)")
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and not output:
            if part.get("image_url") is None:
                raise invalid(f"{where}: 'image_url' is required")
            url = part["image_url"]
            parts.append({"type": "image_url", "image_url": url if isinstance(url, dict) else {"url": url}})
        elif kind == "input_file":
            raise invalid(FILE_REFUSAL)
        elif kind == "input_audio":
            raise invalid("audio input is not supported")
        else:
            allowed = "'output_text' or 'refusal'" if output else "'input_text', 'input_image' or 'input_file'"
            raise invalid(f"{where}: 'type' of a content part must be {allowed}, not {kind!r}")
    return parts


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its ``content``, else the ``encrypted_content`` this server wrote,
    else its summary."""
    content = item.get("content")
    if content is not None and not isinstance(content, list):
        raise invalid(f"{where}: 'content' of a reasoning item must be an array")
    texts = [c.get("text") for c in content or [] if isinstance(c, dict)]
    if any(not isinstance(t, str) for t in texts):
        raise invalid(f"{where}: each 'content' part of a reasoning item requires 'text' (a string)")
    if texts:
        return "".join(texts)
    sealed = item.get("encrypted_content")
    if isinstance(sealed, str) and sealed.startswith(ENCRYPTED_PREFIX):
        try:
            return base64.b64decode(sealed[len(ENCRYPTED_PREFIX):], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise invalid(f"{where}: 'encrypted_content' is not one this server wrote") from None
    summary = item.get("summary")
    if not isinstance(summary, list):
        raise invalid(f"{where}: a reasoning item requires 'summary' (an array)")
    return "\n".join(s["text"] for s in summary if isinstance(s, dict) and isinstance(s.get("text"), str))


def seal_reasoning(text: str) -> str:
    """The ``encrypted_content`` of a reasoning item this server writes (see the module doc)."""
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def input_messages(value: Any) -> list[dict]:
    """``input`` (a string or items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid("'input' must be a string or array of objects")
    messages: list[dict] = []

    def assistant() -> dict:
        """The assistant message the next assistant item joins (a new one unless the last is one)."""
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})
        return messages[-1]

    for i, item in enumerate(value):
        where = f"input item {i}"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role in ("user", "system", "developer"):
                content = item.get("content")
                messages.append({"role": role, "content": content if isinstance(content, str) else
                                 _text_parts(content, where, output=False)})
            elif role == "assistant":
                text = "".join(p["text"] for p in _text_parts(item.get("content", ""), where, output=True))
                target = assistant()
                target["content"] = (target["content"] + text) if target["content"] else text
            else:
                raise invalid(f"{where}: 'role' must be one of 'user', 'assistant', 'system' or 'developer'")
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if not isinstance(item.get(name), str):
                    raise invalid(f"{where}: a function_call item requires '{name}' (a string)")
            target = assistant()
            target.setdefault("tool_calls", []).append({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise invalid(f"{where}: a function_call_output item requires 'call_id' (a string)")
            output = item.get("output")
            if isinstance(output, list):
                parts = _text_parts(output, where, output=False)
                output = parts if any(p["type"] != "text" for p in parts) else "".join(p["text"] for p in parts)
            elif not isinstance(output, str):
                raise invalid(f"{where}: 'output' of a function_call_output item must be a string or an array")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            text = _reasoning_text(item, where)
            if text:
                target = assistant()
                target["reasoning_content"] = target.get("reasoning_content", "") + text
        elif kind is None:
            raise invalid(f"Cannot determine type of {where}: it has neither 'type' nor 'role'")
        else:
            raise invalid(f"{where}: items of type {str(kind)[:64]!r} are not supported (message, function_call, "
                          "function_call_output and reasoning items are)")
    return messages


def _function_tools(tools: Any) -> list[dict]:
    """The function tools (non-function tools have no chat counterpart: left out, logged, as upstream)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array of objects")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"Field 'tools': tool {i} must be an object")
        if tool.get("type") != "function":
            log.warning("the Responses tool of type %r has no chat counterpart: left out", tool.get("type"))
            continue
        if not isinstance(tool.get("name"), str):
            raise invalid(f"Field 'tools': function tool {i} requires 'name' (a string)")
        out.append(tool)
    return out


def _chat_tool(tool: dict) -> dict:
    function = {k: v for k, v in tool.items() if k != "type"}
    function.setdefault("strict", True)  # the Responses default, as upstream passes it on
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, tools: list[dict]) -> tuple[Any, list[dict]]:
    """The chat ``tool_choice`` and the tools it leaves (``allowed_tools`` narrows them)."""
    if choice is None or isinstance(choice, str):
        return choice, tools
    if not isinstance(choice, dict):
        raise invalid("Invalid tool_choice: expected a string or an object")
    kind = choice.get("type")
    if kind == "function":
        if not isinstance(choice.get("name"), str):
            raise invalid("Invalid tool_choice: a function choice requires 'name'")
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    if kind == "allowed_tools":
        mode, allowed = choice.get("mode", "auto"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise invalid("Invalid tool_choice: allowed_tools requires 'mode' (auto or required) and 'tools'")
        if not all(isinstance(t, dict) and (t.get("type") != "function" or isinstance(t.get("name"), str))
                   for t in allowed):
            raise invalid("Invalid tool_choice: each of allowed_tools' 'tools' is an object, a function one with "
                          "'name' (a string)")
        names = {t["name"] for t in allowed if t.get("type") == "function"}
        return mode, [t for t in tools if t["name"] in names]
    raise invalid(f"Invalid tool_choice: {str(kind)[:64]!r} tools are not supported (only function tools)")


def _response_format(text: Any) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid(f"Field 'text': type must be object, but is {json_type_name(text)}")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid("Field 'text': 'format' must be of type text, json_object or json_schema")


def _refuse_unsupported(body: dict) -> None:
    for name, why in (("conversation", "the Conversations API is not implemented; use previous_response_id"),
                      ("prompt", "stored prompt templates are not implemented")):
        if body.get(name) is not None:
            raise invalid(f"Field '{name}': {why}")
    if body.get("truncation") not in (None, "disabled"):
        raise invalid("Field 'truncation': only 'disabled' is supported (a prompt over the context is refused)")
    for name in ("top_logprobs", "logprobs", "n_probs"):  # the last two: chat fields that would pass through
        if body.get(name) not in (None, 0, False):
            raise invalid(f"Field '{name}': log probabilities are not implemented on /v1/responses")
    for name in ("n", "n_cmpl"):
        if body.get(name) not in (None, 1):
            raise invalid(f"Field '{name}': a response has one output; ask for one completion")


def translate(body: dict, store: ResponseStore, developer_role: bool = False) -> tuple[dict, ResponsesRequest]:
    """The chat body of a Responses request, and what its format keeps of it. Unless the template
    has a ``developer`` role of its own (``developer_role``: GPT-OSS's harmony format), developer
    messages go to it as system messages, as upstream maps them."""
    if "input" not in body:
        raise invalid("'input' is required")
    _refuse_unsupported(body)
    instructions = typed(body, "instructions", str, "string")
    previous = typed(body, "previous_response_id", str, "string")
    store_it = typed(body, "store", bool, "boolean")
    background = bool(typed(body, "background", bool, "boolean"))
    metadata = typed(body, "metadata", dict, "object") or {}
    max_output = typed(body, "max_output_tokens", int, "number")
    max_calls = typed(body, "max_tool_calls", int, "number")
    include = typed(body, "include", list, "array") or []
    reasoning = typed(body, "reasoning", dict, "object") or {}
    effort = typed(reasoning, "effort", str, "string")
    check_range("max_tool_calls", max_calls, 0, INT_MAX)
    if store_it is False and background:
        raise invalid("Field 'background': a background response must be stored (store: true)")
    if background and body.get("stream") is True:
        raise invalid("Field 'background': mlxcel-server does not stream background responses; poll "
                      "GET /v1/responses/{id} instead")
    for entry in include:
        if entry not in INCLUDES:
            raise invalid(f"Field 'include': {str(entry)[:80]!r} is not supported (supported: {', '.join(INCLUDES)})")

    earlier: list[dict] = []
    if previous:
        stored = store.get(previous)
        if stored is None:
            raise ApiError(f"Previous response with id '{previous}' not found.", "not_found_error")
        if stored.reply is None:
            raise invalid(f"Previous response with id '{previous}' has not completed yet.")
        earlier = stored.history()
    conversation = earlier + input_messages(body["input"])
    if not developer_role:
        conversation = [{**m, "role": "system"} if m["role"] == "developer" else m for m in conversation]

    tools = _function_tools(body.get("tools"))
    choice, allowed = _tool_choice(body.get("tool_choice"), tools)
    chat = {k: v for k, v in body.items() if k not in _CONSUMED}
    system = [{"role": "system", "content": instructions}] if instructions is not None else []
    chat["messages"] = system + conversation
    if allowed:
        chat["tools"] = [_chat_tool(t) for t in allowed]
    if choice is not None:
        chat["tool_choice"] = choice
    if max_output is not None:
        chat["max_tokens"] = max_output
    if effort is not None:
        chat["reasoning_effort"] = effort
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    request = ResponsesRequest(
        id=new_id("resp_"), conversation=conversation, instructions=instructions, tools=tools,
        tool_choice=body.get("tool_choice") or "auto", store=store_it is not False, background=background,
        previous_response_id=previous, metadata=metadata, max_output_tokens=max_output, max_tool_calls=max_calls,
        reasoning_effort=effort, text=body.get("text") or {"format": {"type": "text"}},
        user=body.get("user") if isinstance(body.get("user"), str) else None,
        include_encrypted="reasoning.encrypted_content" in include)
    return chat, request
