"""``--jinja`` / ``--no-jinja`` as upstream: without Jinja the server renders one of upstream's
built-in formats (named with ``--chat-template``, or detected from the model's template) and
refuses tools; with Jinja any ``--chat-template`` string is Jinja source, even one that is plain
text. Real servers on a tiny checkpoint."""

from __future__ import annotations

import httpx
import pytest
from server_process import ServerProcess

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": " Hi there\n"}]


@pytest.fixture(scope="module")
def command_r(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "256", "--no-jinja", "--chat-template", "command-r")
    with httpx.Client(base_url=proc.url, timeout=60) as c:
        yield c
    proc.stop()


def test_a_named_format_renders_as_upstreams_builtin(command_r):
    r = command_r.post("/apply-template", json={"messages": MESSAGES})
    assert r.status_code == 200, r.text
    # content trimmed, the turn tokens of the format, the reply turn opened
    assert r.json()["prompt"] == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                                  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


def test_a_final_assistant_message_is_continued_in_the_builtin_format(command_r):
    r = command_r.post("/apply-template", json={"messages": [*MESSAGES, {"role": "assistant", "content": "Whill"}]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"].endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Whill")


@pytest.mark.parametrize("extra, message", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools param requires --jinja flag"),
    ({"tool_choice": "required"}, "tool_choice param requires --jinja flag"),
])
def test_tools_need_jinja(command_r, extra, message):
    r = command_r.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, **extra})
    assert r.status_code == 400 and r.json()["error"]["message"] == message


def test_with_jinja_any_template_string_is_jinja_source(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-c", "256", "--chat-template", "This is not a chat template")
    try:
        r = httpx.post(proc.url + "/apply-template", json={"messages": MESSAGES}, timeout=60)
        assert r.status_code == 200 and r.json()["prompt"] == "This is not a chat template"
    finally:
        proc.stop()
