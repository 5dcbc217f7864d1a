"""The web chat page in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python API; Playwright's own browser is never downloaded), against a real server running prompt
lookup behind an API key: the page asks for the key once, streams a reply, shows the speculation
badge and highlights accepted drafts, sends a predicted output and shows its use, and stops a reply.
A screenshot of each lands in ``test-artifacts/`` (gitignored). Also: the per-token draft flags agree
with the timings, and ``--path`` / ``--no-ui`` serve what upstream serves."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from server_process import REPO, ServerProcess

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
KEY = "page-secret"
REPEAT = "Repeat this list exactly three times: apple, banana, cherry, date, elderberry, fig, grape."
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def server():
    """The built-in SmolLM2 with prompt lookup (a real model, so the page shows real text)."""
    proc = ServerProcess("--spec-type", "ngram-simple", "--api-key", KEY, "-np", "1", "-c", "2048")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (make setup-test installs it)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM}: scripts/setup.sh installs Debian's chromium package with apt-get; "
                    "this machine has no apt-get or could not install it")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def shot(page, name: str, tmp_path: Path) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    shutil.copy(path, tmp_path / path.name)
    return path


def open_page(browser, server):
    # bypass_csp: Playwright's own waits evaluate strings, which the page's policy forbids
    page = browser.new_context(viewport={"width": 1200, "height": 820}, bypass_csp=True).new_page()
    errors, asked = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (asked.append(d.message), d.accept(KEY)))
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent !== '…'")
    return page, errors, asked


def set_field(page, field: str, value: str) -> None:
    page.click("#settings-button")
    page.fill(f"#{field}", value)
    page.dispatch_event(f"#{field}", "change")
    page.click("#settings-close")


def stored_reply(page) -> dict:
    return json.loads(page.evaluate("localStorage.getItem('mlxcel.conversations')"))[0]["messages"][-1]


def test_chat_streams_and_shows_speculation(browser, server, tmp_path):
    page, errors, asked = open_page(browser, server)
    assert len(asked) == 1 and "API key" in asked[0]  # asked once, then kept
    assert "SmolLM2" in page.inner_text("#model") and "context 2048" in page.inner_text("#modelinfo")  # from /props
    assert not page.is_visible("#attach")  # a text model: no image button (/props modalities.vision is false)
    set_field(page, "temperature", "0")
    set_field(page, "max_tokens", "40")
    page.fill("#input", REPEAT)
    page.click("#send")
    page.wait_for_function("document.querySelector('.msg.assistant .body').textContent.length > 0")
    streaming = page.inner_text(".msg.assistant .body")
    assert page.is_visible("#stop")  # text arrived while the reply was still running: streamed
    page.wait_for_selector("#stop", state="hidden", timeout=240_000)
    final = page.inner_text(".msg.assistant .body")
    assert final.startswith(streaming[:10]) and len(final) > len(streaming)
    badge = page.inner_text(".msg.assistant .badge")
    timings = stored_reply(page)["stats"]["timings"]
    assert timings["draft_n_accepted"] > 0, timings
    assert f"prompt-lookup: {timings['draft_n_accepted']}/{timings['draft_n']} drafts accepted" in badge
    assert f"{timings['draft_rounds']} verify rounds" in badge and "tok/s" in badge
    assert page.locator(".msg.assistant .drafted").count() > 0  # accepted drafts highlighted
    assert "banana" in final.lower()
    shot(page, "webui-speculation", tmp_path)
    page.reload()  # the conversation and the key survive a reload, and nothing asks again
    page.wait_for_selector(".msg.assistant .badge")
    assert len(asked) == 1 and page.locator(".msg.assistant .drafted").count() > 0
    assert errors == []
    page.context.close()


def test_a_predicted_output_goes_with_the_request_and_its_use_is_shown(browser, server, tmp_path):
    """The settings' predicted output is sent as OpenAI's ``prediction``: the reply is the one the API
    gives without it (temperature 0), it drafted from the prediction ahead of the server's prompt lookup,
    and the badge shows how many of the prediction's tokens the reply used."""
    ask = {"messages": [{"role": "user", "content": REPEAT}], "max_tokens": 40, "temperature": 0}
    answer = httpx.post(server.url + "/v1/chat/completions", json=ask, timeout=240,
                        headers={"Authorization": f"Bearer {KEY}"}).json()["choices"][0]["message"]["content"]
    page, errors, _ = open_page(browser, server)
    set_field(page, "temperature", "0")
    set_field(page, "max_tokens", "40")
    page.click("#settings-button")
    page.fill("#prediction", answer)
    page.click("#settings-close")
    page.fill("#input", REPEAT)
    page.click("#send")
    page.wait_for_selector(".msg.assistant .badge .prediction", timeout=240_000)
    reply = stored_reply(page)
    assert reply["content"] == answer
    timings, used = reply["stats"]["timings"], reply["stats"]["usage"]["completion_tokens_details"]
    assert timings["draft_kind"] == "prediction+prompt-lookup" and timings["draft_n_accepted"] > 0, timings
    assert used["accepted_prediction_tokens"] > 0, used
    assert (f"prediction: {used['accepted_prediction_tokens']} tokens used, {used['rejected_prediction_tokens']} not"
            in page.inner_text(".msg.assistant .badge"))
    shot(page, "webui-prediction", tmp_path)
    page.reload()  # the box is kept with the other settings
    page.click("#settings-button")
    assert page.input_value("#prediction") == answer
    assert errors == []
    page.context.close()


def test_stop_a_reply(browser, server, tmp_path):
    page, errors, _ = open_page(browser, server)
    page.click("#new")
    set_field(page, "max_tokens", "600")
    page.fill("#input", "Write a very long story about a robot who learns to paint.")
    page.click("#send")
    page.wait_for_function("document.querySelector('.msg.assistant:last-child .body').textContent.length > 20",
                           timeout=120_000)
    page.click("#stop")
    page.wait_for_selector(".msg.assistant:last-child .stopped")
    stopped = page.inner_text(".msg.assistant:last-child .body")
    time.sleep(1.5)
    assert page.inner_text(".msg.assistant:last-child .body") == stopped  # nothing more arrives
    assert page.is_visible("#send") and not page.is_visible("#stop")
    headers = {"Authorization": f"Bearer {KEY}"}
    for _ in range(50):  # the server dropped the request: its slot is free again
        if not httpx.get(server.url + "/slots", headers=headers).json()[0]["is_processing"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the stopped request still runs")
    shot(page, "webui-stopped", tmp_path)
    assert errors == []
    page.context.close()


def test_markdown_is_escaped_and_rendered(browser, server):
    """The page's own renderer (evaluated in the page): HTML in model output stays text, only
    http(s)/mailto links become links, code blocks and inline Markdown render, and draft markers
    turn into highlighted spans across element boundaries."""
    page, errors, _ = open_page(browser, server)
    html = page.evaluate("""() => markdown([
        "# Title", "<script>alert(1)</script> <img src=x onerror=alert(1)>", "",
        "**bold** and *it* and `a<b>`", "- one", "- two", "", "1. first",
        "```python", "print('<tag>')", "```", "[ok](https://example.com) [bad](javascript:alert(1))"].join("\\n"))""")
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<code>a&lt;b&gt;</code>" in html and "<ul><li>one</li><li>two</li></ul>" in html and "<ol><li>first" in html
    assert '<code class="language-python">print(&#39;&lt;tag&gt;&#39;)</code>' in html
    assert '<a href="https://example.com"' in html and 'href="javascript' not in html
    spans = page.evaluate("""() => {
        const d = document.createElement('div');
        d.innerHTML = markdown('plain \\uE000**dra' + 'fted** more\\uE001 tail');
        highlightMarks(d);
        return [...d.querySelectorAll('.drafted')].map((s) => s.textContent).join('|');
    }""")
    assert spans == "drafted| more"  # the highlight crosses the <strong> boundary
    assert errors == []
    page.context.close()


def test_draft_flags_match_the_timings(server):
    """``mlxcel_draft_flags``: one flag per streamed token, true exactly for the accepted drafts."""
    body = {"messages": [{"role": "user", "content": REPEAT}], "stream": True, "mlxcel_draft_flags": True,
            "max_tokens": 32, "temperature": 0}
    flags, timings = [], None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=240,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                flags += chunk.get("mlxcel_draft_flags", [])
                timings = chunk.get("timings", timings)
    assert timings["draft_n_accepted"] > 0
    assert sum(flags) == timings["draft_n_accepted"]
    assert len(flags) == timings["predicted_n"]  # stopped by the limit, so every token was streamed


def test_path_serves_a_users_files_and_no_ui_serves_nothing(tiny_llama_dir, tmp_path):
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("<!doctype html><title>mine</title>")
    (site / "sub" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("outside")
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "1", "--path", str(site))
    try:
        assert httpx.get(proc.url + "/").text == "<!doctype html><title>mine</title>"
        assert httpx.get(proc.url + "/sub/a.txt").text == "hello"
        for bad in ("/../secret.txt", "/%2e%2e/secret.txt", "/sub/../../secret.txt", "/missing.txt"):
            r = httpx.get(proc.url + bad)
            assert r.status_code == 404 and "outside" not in r.text, bad
        assert httpx.get(proc.url + "/health").json() == {"status": "ok"}  # API routes come first
    finally:
        proc.stop()
    from mlxcel.server.http.app import create_app
    from mlxcel.server.runtime.config import ServerConfig

    def pages(config):
        return {r.path for r in create_app(config).routes if "GET" in getattr(r, "methods", ())} & {"/", "/index.html"}

    assert pages(ServerConfig()) == {"/", "/index.html"}
    assert pages(ServerConfig(ui=False)) == set()
