"""Chat messages -> prompt text, with the model's Jinja chat template.

The template comes from the model (tokenizer config or GGUF metadata, ``LoadedModel.chat_template``)
or from ``--chat-template`` / ``--chat-template-file`` (a Jinja string, or the built-in name
``chatml``). It is rendered by the tokenizer's ``apply_chat_template`` (transformers' sandboxed
Jinja environment), so templates behave as they do in transformers.
"""

from __future__ import annotations

import datetime
from typing import Any

from mlxcel.server.runtime.errors import invalid

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BUILTIN_TEMPLATES = {"chatml": CHATML}
# OpenAI's message roles; any other is refused rather than handed to the template
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def resolve_template(model_template: str | None, override: str | None) -> str | None:
    """The template in force: ``--chat-template`` (built-in name or Jinja source) over the model's."""
    if override:
        if override in BUILTIN_TEMPLATES:
            return BUILTIN_TEMPLATES[override]
        if "{%" in override or "{{" in override:
            return override
        raise ValueError(f"unknown chat template {override!r}: mlxcel knows the built-in "
                         f"{', '.join(BUILTIN_TEMPLATES)}, or give the Jinja source itself")
    return model_template


def normalize_messages(messages: Any) -> list[dict]:
    """Validate OpenAI-style messages; content parts of type ``text`` are joined into a string."""
    if messages is None:
        raise invalid("'messages' is required")
    if not isinstance(messages, list):
        raise invalid("Expected 'messages' to be an array")
    if not messages:
        raise invalid("'messages' must contain at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise invalid(f"Failed to parse messages: message {i} must be an object")
        role = msg.get("role")
        if not isinstance(role, str):
            raise invalid(f"Failed to parse messages: 'role' of message {i} must be a string")
        if role not in ROLES:
            raise invalid(f"Failed to parse messages: unknown role {role[:64]!r} in message {i}; "
                          f"expected one of {', '.join(sorted(ROLES))}")
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise invalid("Failed to parse messages: only text content parts are supported")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise invalid(f"Failed to parse messages: 'content' of message {i} must be a string or an array")
        out.append({**msg, "role": role, "content": content})
    return out


def apply_template(tokenizer, template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                   extra: dict | None = None, continue_final_message: bool = False) -> str:
    """``messages`` rendered; ``continue_final_message`` leaves the last (assistant) message open, so
    the model continues it (transformers renders it closed and cuts after its content)."""
    if not template:
        raise invalid("this model has no chat template; start the server with --chat-template")
    tok = getattr(tokenizer, "_tokenizer", tokenizer)
    # the dates upstream puts in every template's context (Llama 3.x templates print date_string);
    # a chat_template_kwargs entry of the same name wins
    now = datetime.datetime.now()
    extra = {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"), **(extra or {})}
    # a template variable the request sets through chat_template_kwargs wins, as upstream merges them
    add_generation_prompt = bool(extra.pop("add_generation_prompt", add_generation_prompt))
    for reserved in ("tokenize", "chat_template", "continue_final_message", "conversation", "return_dict"):
        extra.pop(reserved, None)
    try:
        return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message, **extra)
    except Exception as exc:  # a template error is the request's problem, not the server's
        raise invalid(f"failed to apply the chat template: {exc}") from None
