"""An Anthropic Messages request (``POST /v1/messages``) translated into the chat request the one
completion pipeline runs.

As upstream: ``system`` (a string or text blocks) becomes a system message; content blocks become
chat messages (``text`` parts; ``thinking`` the assistant's ``reasoning_content``; ``tool_use``
its ``tool_calls`` with the input as JSON arguments; each ``tool_result`` a ``tool`` message);
``tools`` (``name``, ``description``, ``input_schema``) the chat tools; ``stop_sequences``
``stop``; ``temperature``, ``top_p``, ``top_k``, ``stream`` and ``chat_template_kwargs`` go
through, and so does every llama-server sampling field, as on the Responses route. The volatile
``cch=`` stamp of a Claude Code billing-header system prompt is masked, as upstream does, so the
prompt cache reaches past it.

Where upstream is more lenient than Anthropic's API, this follows the API its clients are written
for: ``max_tokens`` is required (upstream defaults it to 4096), ``messages`` must hold one
message at least, a named ``tool_choice`` names the function (upstream only requires a call),
``tool_choice: none`` and ``disable_parallel_tool_use`` are honoured, ``thinking`` ``enabled`` /
``disabled`` also switch the template's ``enable_thinking`` (upstream only sets the budget), and
the blocks of a message keep their order (a ``tool_result`` after text stays after it). An ``image``
block (a base64 ``source`` as a data URL, or a ``url`` one) becomes a chat ``image_url`` part, as
upstream translates it, in a message or a tool result; the chat plan reads it (or refuses it on a text
model). Documents are refused with a 400.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mlxcel.server.http.body_fields import typed
from mlxcel.server.runtime.errors import invalid

DOCUMENT_REFUSAL = "document blocks are not supported (text and image blocks are)"
_BILLING_STAMP = re.compile(r"^(x-anthropic-billing-header:.*?cch=)[0-9a-zA-Z]{5};")
# Anthropic fields read here; every other field of the body goes through to the chat request
_CONSUMED = ("model", "messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
             "metadata", "service_tier", "container", "mcp_servers", "context_management", "output_format")


def _system_text(system: Any) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        blocks = [system]
    elif isinstance(system, list):
        blocks = []
        for block in system:
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise invalid("system: each block must be a text block ({'type': 'text', 'text': ...})")
            blocks.append(block["text"])
    else:
        raise invalid("system: must be a string or an array of text blocks")
    return "\n\n".join(_BILLING_STAMP.sub(r"\1fffff;", text) for text in blocks)


def _image_part(block: dict, where: str) -> dict:
    """An ``image`` block as a chat ``image_url`` part."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type = source.get("media_type") or "image/jpeg"
        if not isinstance(media_type, str) or not isinstance(source.get("data"), str):
            raise invalid(f"{where}: a base64 image source requires 'data' (a string)")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{source['data']}"}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url")}}
    raise invalid(f"{where}: an image block's 'source' must be of type 'base64' or 'url'")


def _tool_result_content(content: Any, where: str) -> str | list[dict]:
    """A tool result's content: its text, or (with images) its text and image parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}: 'content' of a tool_result must be a string or an array of blocks")
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "document":
            raise invalid(DOCUMENT_REFUSAL)
        else:
            raise invalid(f"{where}: a tool_result holds text and image blocks, not {kind!r}")
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _message(msg: Any, i: int) -> list[dict]:
    """One Anthropic message as chat messages (a user message with tool results is several)."""
    where = f"messages.{i}"
    if not isinstance(msg, dict):
        raise invalid(f"{where}: must be an object")
    role = msg.get("role")
    if role not in ("user", "assistant", "system"):
        raise invalid(f"{where}: 'role' must be 'user' or 'assistant'")
    if "content" not in msg:
        raise invalid(f"{where}: 'content' is required")
    content = msg["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}: 'content' must be a string or an array of content blocks")
    out: list[dict] = []

    def current() -> dict:
        if not out or out[-1]["role"] != role:
            out.append({"role": role, "content": []})
        return out[-1]

    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise invalid(f"{at}: a text block requires 'text' (a string)")
            current()["content"].append({"type": "text", "text": block["text"]})
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise invalid(f"{at}: a thinking block requires 'thinking' (a string)")
            msg_out = current()
            msg_out["reasoning_content"] = msg_out.get("reasoning_content", "") + block["thinking"]
        elif kind == "redacted_thinking":
            continue  # opaque to this server: nothing to render
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid(f"{at}: a tool_use block requires 'id' and 'name' (strings)")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            current().setdefault("tool_calls", []).append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise invalid(f"{at}: a tool_result block requires 'tool_use_id' (a string)")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _tool_result_content(block.get("content"), at)})
        elif kind == "image":
            current()["content"].append(_image_part(block, at))
        elif kind == "document":
            raise invalid(DOCUMENT_REFUSAL)
        else:
            raise invalid(f"{at}: content blocks of type {str(kind)[:64]!r} are not supported (text, thinking, "
                          "tool_use and tool_result are)")
    for m in out:
        if m["role"] != "tool" and not m["content"]:
            m["content"] = ""
    return out


def _tools(tools: Any) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools: must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid(f"tools.{i}: a tool requires 'name' (a string)")
        schema = tool.get("input_schema")
        if schema is not None and not isinstance(schema, dict):
            raise invalid(f"tools.{i}: 'input_schema' must be a JSON schema object")
        if not isinstance(tool.get("description", ""), (str, type(None))):
            raise invalid(f"tools.{i}: 'description' must be a string")
        function = {"name": tool["name"], "description": tool.get("description") or "",
                    "parameters": schema or {"type": "object", "properties": {}}}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` (None: the template's own)."""
    if choice is None:
        return None, None
    if not isinstance(choice, dict):
        raise invalid("tool_choice: must be an object ({'type': 'auto' | 'any' | 'tool' | 'none'})")
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") is True else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise invalid("tool_choice: a 'tool' choice requires 'name'")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise invalid("tool_choice: 'type' must be 'auto', 'any', 'tool' or 'none'")


def _thinking(thinking: Any, chat: dict) -> None:
    if thinking is None:
        return
    if not isinstance(thinking, dict):
        raise invalid("thinking: must be an object ({'type': 'enabled', 'budget_tokens': N} or {'type': 'disabled'})")
    kind = thinking.get("type")
    kwargs = dict(typed(chat, "chat_template_kwargs", dict, "object") or {})
    if kind == "enabled":
        budget = typed(thinking, "budget_tokens", int, "number")
        chat["thinking_budget_tokens"] = 10000 if budget is None else budget  # upstream's default
        kwargs.setdefault("enable_thinking", True)
    elif kind == "disabled":
        kwargs.setdefault("enable_thinking", False)
    elif kind != "adaptive":
        raise invalid("thinking: 'type' must be 'enabled', 'disabled' or 'adaptive'")
    if kwargs:
        chat["chat_template_kwargs"] = kwargs


def translate(body: dict, *, count_only: bool = False) -> dict:
    """The chat body of a Messages request (``count_only``: of a count_tokens request, which has
    no ``max_tokens``)."""
    if "messages" not in body:
        raise invalid("messages: Field required")
    if not count_only:
        if "max_tokens" not in body:
            raise invalid("max_tokens: Field required")
        max_tokens = typed(body, "max_tokens", int, "number")
        if max_tokens is not None and max_tokens < 1:
            raise invalid(f"max_tokens: must be at least 1, but is {max_tokens}")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid("messages: Input should be a valid list")
    if not messages:
        raise invalid("messages: at least one message is required")
    for name in ("mcp_servers", "container"):
        if body.get(name):
            raise invalid(f"{name}: not supported by mlxcel-server (no server-side tools)")
    for name in ("n", "n_cmpl"):
        if body.get(name) not in (None, 1):
            raise invalid(f"{name}: a message has one output; ask for one completion")
    for name in ("logprobs", "top_logprobs", "n_probs"):  # chat fields that would pass through unread
        if body.get(name) not in (None, 0, False):
            raise invalid(f"{name}: log probabilities are not implemented on /v1/messages")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise invalid("stop_sequences: must be an array of strings")
    chat = {k: v for k, v in body.items() if k not in _CONSUMED}
    system = _system_text(body.get("system"))
    chat["messages"] = ([{"role": "system", "content": system}] if system is not None else []) + [
        m for i, msg in enumerate(messages) for m in _message(msg, i)]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice, parallel = _tool_choice(body.get("tool_choice"))
    if choice is not None and (tools or choice != "none"):
        chat["tool_choice"] = choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    if stops:
        chat["stop"] = stops
    if not count_only:
        chat["max_tokens"] = body["max_tokens"]
    _thinking(body.get("thinking"), chat)
    output_format = body.get("output_format")
    if output_format is not None:
        if not isinstance(output_format, dict) or output_format.get("type") != "json_schema":
            raise invalid("output_format: 'type' must be 'json_schema'")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": output_format.get("schema")}}
    return chat
