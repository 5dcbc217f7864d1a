"""Chat messages -> prompt text, with the model's Jinja chat template.

The template comes from ``--chat-template`` / ``--chat-template-file``, else the model (tokenizer
config or GGUF metadata, ``LoadedModel.chat_template``), else ChatML, as upstream. With Jinja (the
default) it is rendered by the tokenizer's ``apply_chat_template`` (transformers' sandboxed Jinja
environment), so templates behave as they do in transformers; any ``--chat-template`` string is
Jinja source there, except the name ``chatml``. With ``--no-jinja`` the template picks one of
upstream's built-in formats (a name such as ``llama3``, or detected from the Jinja source) and
:mod:`legacy_templates` renders it.
"""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Any

import jinja2

try:  # transformers' cached compiler of chat templates (see _lenient)
    from transformers.utils.chat_template_utils import _compile_jinja_template
except ImportError:  # pragma: no cover
    _compile_jinja_template = None

from mlxcel.server.http.chat import legacy_templates
from mlxcel.server.http.media import MarkersOnly, MediaCollector, content_part_text, joined
from mlxcel.server.runtime.errors import invalid

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# OpenAI's message roles; any other is refused rather than handed to the template
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def resolve_template(model_template: str | None, override: str | None) -> str:
    """The template source in force: ``--chat-template`` over the model's, ChatML when neither
    gives one (as upstream); the name ``chatml`` is ChatML."""
    source = override or model_template
    return CHATML if not source or source == "chatml" else source


def legacy_format(source: str, from_override: bool) -> str | None:
    """The built-in format ``--no-jinja`` renders ``source`` with: a name, or what upstream's
    heuristics detect in the Jinja source. An override nothing matches is refused at startup, as
    upstream; the model's own template then only fails the chat requests (None)."""
    name = legacy_templates.detect(source)
    if name is None and from_override:
        raise ValueError(f"the supplied chat template is not supported: {source}\nnote: mlxcel was started "
                         f"without --jinja; the built-in formats are {', '.join(legacy_templates.NAMES)}")
    return name


def normalize_messages(messages: Any, join: str = "\n", media: MediaCollector | MarkersOnly | None = None) -> list[dict]:
    """Validate OpenAI-style messages; content parts are joined into a string with ``join`` between
    text parts (upstream joins them with a newline for templates that take string content). Image
    parts become media markers, their images read into ``media`` (``http.media``); without ``media``
    (a text model) they are refused, as upstream refuses them without a projector."""
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
            content = joined([content_part_text(part, media) for part in content], join)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise invalid(f"Failed to parse messages: 'content' of message {i} must be a string or an array")
        out.append({**msg, "role": role, "content": content})
    return out


class _ConcatUndefined(jinja2.Undefined):
    """A missing variable that concatenates as the empty string, as upstream's Jinja engine treats
    it (``"In addition..." + functions`` renders where transformers' default would raise); every
    other use still behaves as Jinja's ``Undefined``."""

    __slots__ = ()

    def __add__(self, other):
        return other if isinstance(other, str) else super().__add__(other)

    def __radd__(self, other):
        return other if isinstance(other, str) else super().__radd__(other)


def _lenient(template: str) -> None:
    """Give transformers' compiled (and cached) template our undefined. It is looked up at render
    time, so setting it on the template's environment is enough; if transformers' internals move,
    rendering simply stays strict (the test of this behaviour then fails and says so)."""
    if _compile_jinja_template is None:
        return
    try:
        _compile_jinja_template(template).environment.undefined = _ConcatUndefined
    except Exception:  # a template that does not compile fails again, with its message, when rendered
        pass


def llama_server_messages(tokenizer, template: str, messages: list[dict]) -> list[dict]:
    """The messages as llama-server hands them to a Jinja template: ``developer`` becomes
    ``system`` (except for GPT-OSS's channel templates, which know it), and a leading system
    message merges into the next one (joined by a newline) for a template that has no place for
    it, e.g. Gemma 2's, which raises on a system turn. (Upstream drops a system message that is
    the only one; an empty conversation is not something transformers renders, so it is kept and
    the template says what it says about it.)"""
    if "<|channel|>" not in template:
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    if len(messages) > 1 and messages[0].get("role") == "system" and not _supports_system_role(tokenizer, template):
        first, rest = messages[0], messages[1:]
        if rest and isinstance(first.get("content"), str) and isinstance(rest[0].get("content"), str):
            rest = [{**rest[0], "content": first["content"] + "\n" + rest[0]["content"]}, *rest[1:]]
        messages = rest
    return messages


_PROBE = "mlxcel system probe"


@lru_cache(maxsize=32)
def _system_role_probe(tok, template: str) -> bool:
    probe = [{"role": "system", "content": _PROBE}, {"role": "user", "content": "User message"}]
    _lenient(template)
    try:
        text = tok.apply_chat_template(probe, chat_template=template, tokenize=False, add_generation_prompt=True)
    except Exception:  # e.g. raise_exception('System role not supported')
        return False
    return _PROBE in text


def _supports_system_role(tokenizer, template: str) -> bool:
    """Whether the template renders a system message's content (upstream probes the same way:
    a system and a user message, and whether the system content was used)."""
    return _system_role_probe(getattr(tokenizer, "_tokenizer", tokenizer), template)


def apply_template(tokenizer, template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                   extra: dict | None = None, continuation: str | None = None, jinja: bool = True,
                   legacy_format: str | None = None) -> str:
    """``messages`` rendered. With ``continuation`` (the text of a final assistant message to
    continue, already taken off ``messages``), as upstream: the rest rendered with the generation
    prompt, then that text as it is, so the model goes on from it. Without ``jinja``
    (``--no-jinja``), ``legacy_format`` is the built-in format to render with (None: the template
    matched none)."""
    if not jinja:
        return _apply_legacy(legacy_format, messages, add_generation_prompt, continuation)
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
    if continuation is not None:
        add_generation_prompt = True
    messages = llama_server_messages(tokenizer, template, messages)
    _lenient(template)
    try:
        text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                       add_generation_prompt=add_generation_prompt, **extra)
    except Exception as exc:  # a template error is the request's problem, not the server's
        raise invalid(f"failed to apply the chat template: {exc}") from None
    return text if continuation is None else text + continuation


def _apply_legacy(name: str | None, messages: list[dict], add_generation_prompt: bool,
                  continuation: str | None) -> str:
    if name is None:
        raise invalid("this custom template is not supported, try using --jinja")
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        text = legacy_templates.render(name, plain, add_generation_prompt or continuation is not None)
    except ValueError as exc:
        raise invalid(f"failed to apply the chat template: {exc}") from None
    return text if continuation is None else text + continuation
