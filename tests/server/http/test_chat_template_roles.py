"""Roles as upstream hands them to a Jinja template: ``developer`` read as ``system`` (except by a
GPT-OSS channel template), and a leading system message folded into the first user turn for a
template with no place for it (one that raises on it, as Gemma 2's does, or one that drops it)."""

from __future__ import annotations

import pytest

from mlxcel.server.http.chat.template import apply_template, llama_server_messages
from mlxcel.server.runtime.errors import ApiError

# a template that refuses a system turn, as some families' do
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}")
# one that silently ignores it
DROPS_SYSTEM = "{% for m in messages %}{% if m['role'] != 'system' %}[{{ m['content'] }}]{% endif %}{% endfor %}"
WITH_SYSTEM = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
CHANNELS = WITH_SYSTEM + "{# <|channel|> #}"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]


def render(tokenizer, template, messages=CHAT) -> str:
    return apply_template(tokenizer, template, messages, add_generation_prompt=False)


def test_a_system_turn_the_template_refuses_joins_the_first_user_turn(tiny_llama):
    tok = tiny_llama.tokenizer
    assert render(tok, NO_SYSTEM) == "<user>Be brief.\nHi</user><assistant>Hello</assistant><user>Bye</user>"
    assert render(tok, DROPS_SYSTEM) == "[Be brief.\nHi][Hello][Bye]"
    assert render(tok, WITH_SYSTEM) == "<system>Be brief.<user>Hi<assistant>Hello<user>Bye"
    # alone it stays, and the template says what it says about it
    assert render(tok, DROPS_SYSTEM, CHAT[:1]) == ""


def test_developer_is_system_except_for_channel_templates(tiny_llama):
    tok = tiny_llama.tokenizer
    dev = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "Hi"}]
    assert render(tok, WITH_SYSTEM, dev) == "<system>Rules.<user>Hi"
    assert render(tok, CHANNELS, dev) == "<developer>Rules.<user>Hi"
    assert llama_server_messages(tok, NO_SYSTEM, dev)[0] == {"role": "user", "content": "Rules.\nHi"}


def test_a_template_error_other_than_the_system_turn_is_still_the_requests(tiny_llama):
    broken = "{{ raise_exception('no assistant turns here') if messages|length > 1 else messages[0]['content'] }}"
    with pytest.raises(ApiError, match="no assistant turns here"):
        render(tiny_llama.tokenizer, broken, CHAT[1:])
