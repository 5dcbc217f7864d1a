"""What a chat template sees, as upstream gives it: the dates (``date_string``, ``datetime``),
``enable_thinking`` from ``--reasoning on|off``, ``reasoning_effort`` from ``--reasoning-effort``
and from the request (where ``"none"`` turns thinking off), ``chat_template_kwargs`` over all of
them, undefined variables that concatenate as empty strings, content parts joined, and a final
assistant message continued. A real server renders a template that prints them."""

from __future__ import annotations

import datetime

import httpx
import pytest
from server_process import ServerProcess

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
            "|date={{ date_string | default('unset') }}|datetime={{ datetime | default('unset') }}"
            "|thinking={{ enable_thinking | default('unset') }}|effort={{ reasoning_effort | default('unset') }}"
            "|lenient={{ '<' + not_given + '>' }}{% if add_generation_prompt %}|gen=on{% endif %}")
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "256", "--chat-template", TEMPLATE, "--reasoning", "off",
                         "--reasoning-effort", "high")
    with httpx.Client(base_url=proc.url, timeout=60) as c:
        yield c
    proc.stop()


def render(client, messages=MESSAGES, **extra) -> dict[str, str]:
    r = client.post("/apply-template", json={"messages": messages, **extra})
    assert r.status_code == 200, r.text
    head, *parts = r.json()["prompt"].split("|")
    return {"messages": head, **dict(part.split("=", 1) for part in parts)}


def test_an_undefined_variable_concatenates_as_empty_as_upstreams_engine_does(client):
    assert render(client)["lenient"] == "<>"


def test_content_parts_join_with_a_newline_and_a_continued_message_with_a_blank_line(client):
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    got = render(client, [{"role": "user", "content": parts}, {"role": "assistant", "content": parts}])
    # the messages before the continued one, rendered with the generation prompt, then its text as is
    assert got["messages"] == "user:Wh\nill;" and got["gen"] == "onWh\n\nill"
    assert render(client, add_generation_prompt=False)["messages"] == "user:hi;"
    assert "gen" not in render(client, add_generation_prompt=False)


def test_the_dates_are_todays_in_upstreams_two_formats(client):
    got = render(client)
    today = datetime.date.today()
    assert got["date"] in (today.strftime("%d %b %Y"), (today + datetime.timedelta(days=1)).strftime("%d %b %Y"))
    assert got["datetime"] in (today.strftime("%b %d %Y"), (today + datetime.timedelta(days=1)).strftime("%b %d %Y"))


def test_the_command_line_sets_thinking_and_effort(client):
    assert render(client)["thinking"] == "False"
    assert render(client)["effort"] == "high"


def test_the_request_overrides_them(client):
    got = render(client, reasoning_effort="low", chat_template_kwargs={"enable_thinking": True,
                                                                       "date_string": "1 Jan 2000"})
    assert (got["thinking"], got["effort"], got["date"]) == ("True", "low", "1 Jan 2000")


def test_reasoning_effort_none_turns_thinking_off_and_unsets_the_effort(client):
    got = render(client, reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    assert (got["thinking"], got["effort"]) == ("False", "unset")


def test_enable_thinking_as_a_string_is_refused(client):
    r = client.post("/apply-template", json={"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": "yes"}})
    assert r.status_code == 400
    assert "enable_thinking" in r.json()["error"]["message"]
