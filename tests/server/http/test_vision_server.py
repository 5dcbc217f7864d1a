"""Images through real servers, every API that takes them, on tiny vision checkpoints in the layouts
users hold them (``tests/helpers/tiny_vision.py``):

- ``qwen``: Qwen2.5-VL as llama.cpp's converter writes it, ``-m model.gguf --mmproj mmproj.gguf``,
  speculating with a draft model (its own text model, which sees the image's placeholders and so
  drafts some tokens wrong: the rounds after an image verify on the ragged batch, at the positions
  M-RoPE gives them), with slot files and ``--media-path``;
- ``gemma``: Gemma 3 as mlx-vlm saves it, ``-m DIR`` (its own tower, found by itself), speculating with
  prompt lookup (its rounds verify on the row's own cache: Gemma's layers are not the ragged batch's).

Outputs are checked against mlx-vlm's own models (``vision_reference``): the tokens of a prompt with
an image are the greedy tokens mlx-vlm's model gives for it; the other APIs (streamed or not, Responses,
Anthropic Messages, ``/completion``'s ``multimodal_data``) give what the chat request gives. Bad images
and refused sources answer 400 with upstream's messages, and the server goes on serving.
"""

from __future__ import annotations

import base64
import io
import json
import os
from functools import partial

import httpx
import pytest
from server_process import ServerProcess, post_ok, running

pytest.importorskip("mlx_vlm", reason="the vision tests need mlx-vlm (pip install 'mlxcel[vision]')")
from vision_reference import png, reference

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

N = 12
QUESTION = "what is this?"


@pytest.fixture(scope="module")
def servers(vision_files, tmp_path_factory):
    slots = tmp_path_factory.mktemp("vision-slots")
    media = tmp_path_factory.mktemp("vision-media")
    (media / "seven.png").write_bytes(png(7))
    qwen = vision_files["qwen2_5_vl"]
    with running(qwen=partial(ServerProcess, "-m", str(qwen["gguf"]), "--mmproj", str(qwen["mmproj"]), "-np", "2",
                              "--slots", "--slot-save-path", str(slots), "--media-path", str(media),
                              "-md", str(qwen["gguf"]), env={"MLXCEL_VERIFY_COST": "off"}),
                 gemma=partial(ServerProcess, "-m", str(vision_files["gemma3"]["dir"]), "-np", "2",
                               "--spec-type", "ngram-simple", env={"MLXCEL_VERIFY_COST": "off"})) as procs:
        yield procs


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def chat_body(url: str, **fields) -> dict:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": N, "temperature": 0,
            "ignore_eos": True, **fields}


def prompt_ids(vlm_dir, family: str, text_before: str, n_image: int, text_after: str) -> list[int]:
    """The prompt's tokens as llama.cpp's mtmd lays them out: the text before the marker, the family's begin
    text, one placeholder per embedding, its end text, the text after (each piece tokenized alone)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(vlm_dir / "tokenizer.json"))
    begin, end, pad = (("<start_of_image>", "<end_of_image>", "<image_soft_token>") if family == "gemma3" else
                       ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    return ids(text_before) + ids(begin) + [tok.token_to_id(pad)] * n_image + ids(end) + ids(text_after)


FAMILY = {"qwen": "qwen2_5_vl", "gemma": "gemma3"}
IMAGE_TOKENS = {"qwen": 8, "gemma": 4}  # png(7) is 40 x 56: Qwen's 2 x 4 merged patches; Gemma's fixed 4


@pytest.mark.parametrize("name", ["qwen", "gemma"])
def test_props_and_models_report_vision(servers, name):
    props = httpx.get(servers[name].url + "/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert props["media_marker"].startswith("<__media_")
    model = httpx.get(servers[name].url + "/v1/models").json()
    assert model["data"][0]["architecture"]["input_modalities"] == ["text", "image"]
    assert "multimodal" in model["models"][0]["capabilities"]


@pytest.mark.parametrize("name", ["qwen", "gemma"])
def test_a_chat_image_gives_mlx_vlms_tokens(servers, vision_files, name):
    """/completion with the chat's rendered prompt and the image: mlx-vlm's greedy tokens, though both
    servers speculate (the verify rounds keep the target's tokens, accepting drafts and rejecting some)."""
    server, family = servers[name], FAMILY[name]
    rendered = post_ok(server, "/apply-template", chat_body(data_url(png(7))))["prompt"]
    marker = httpx.get(server.url + "/props").json()["media_marker"]
    before, after = rendered.split(marker)
    body = {"prompt": {"prompt_string": rendered, "multimodal_data": [base64.b64encode(png(7)).decode()]},
            "n_predict": N, "temperature": 0, "ignore_eos": True, "return_tokens": True, "cache_prompt": False}
    out = post_ok(server, "/completion", body)
    ids = prompt_ids(vision_files[family]["dir"], family, before, IMAGE_TOKENS[name], after)
    assert out["tokens_evaluated"] == len(ids)
    _, expected = reference(vision_files[family]["dir"], ids, png(7), N)
    assert out["tokens"] == expected
    assert out["timings"]["draft_n"] > 0  # the image request did speculate


@pytest.mark.parametrize("name", ["qwen", "gemma"])
def test_every_api_gives_the_chat_answer(servers, name):
    server = servers[name]
    url = data_url(png(7))
    chat = post_ok(server, "/v1/chat/completions", chat_body(url))
    answer = chat["choices"][0]["message"]["content"]
    assert chat["usage"]["prompt_tokens"] > IMAGE_TOKENS[name]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    messages = chat_body(url)["messages"]
    extra = {"ignore_eos": True}
    streamed = client.chat.completions.create(model="x", messages=messages, max_tokens=N, temperature=0, stream=True,
                                              extra_body=extra)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == answer
    plain = client.chat.completions.create(model="x", messages=messages, max_tokens=N, temperature=0, extra_body=extra)
    assert plain.choices[0].message.content == answer

    response = client.responses.create(model="x", max_output_tokens=N, temperature=0, extra_body=extra, input=[
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": url}]}])
    assert response.output_text == answer

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(7)).decode()}
    message = claude.messages.create(model="x", max_tokens=N, extra_body={**extra, "temperature": 0}, messages=[
        {"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image", "source": source}]}])
    assert message.content[0].text == answer


def test_the_image_decides_the_answer(servers):
    """Two images, two answers (first-token distributions at least): the image's embeddings are used."""
    server = servers["qwen"]
    tops = []
    for seed in (1, 2):
        out = post_ok(server, "/v1/chat/completions", chat_body(data_url(png(seed)), max_tokens=1, logprobs=True,
                                                                top_logprobs=5))
        tops.append([(t["token"], round(t["logprob"], 3)) for t in out["choices"][0]["logprobs"]["content"][0]
                     ["top_logprobs"]])
    assert tops[0] != tops[1]


def native(server, seed: int, **fields) -> dict:
    marker = httpx.get(server.url + "/props").json()["media_marker"]
    body = {"prompt": {"prompt_string": f"Look: {marker} and tell me.", "multimodal_data":
                       [base64.b64encode(png(seed)).decode()]},
            "n_predict": 4, "temperature": 0, "id_slot": 0, "return_tokens": True, **fields}
    return post_ok(server, "/completion", body)


def test_a_cached_prefix_is_reused_only_through_the_same_image(servers):
    server = servers["gemma"]
    first = native(server, 1)
    n_prompt = first["tokens_evaluated"]
    assert native(server, 1)["timings"]["cache_n"] == n_prompt - 1  # same bytes: all but the last token
    other = native(server, 2)["timings"]["cache_n"]
    assert 0 < other < n_prompt - 1 - IMAGE_TOKENS["gemma"]  # another image: only the text before it
    assert native(server, 1)["tokens"] == first["tokens"]


def test_slot_files_keep_their_images(servers):
    """A restored slot's prefix is reused by the same image (giving the tokens a fresh prompt gives, its
    last token fed in the ragged batch at the position M-RoPE puts it), and not past another image's place."""
    server = servers["qwen"]
    first = native(server, 3, cache_prompt=False)
    n_prompt = first["tokens_evaluated"]
    post_ok(server, "/slots/0?action=save", {"filename": "with-image.bin"})
    native(server, 5, n_predict=1)  # the slot now holds another image (the file's images come back with it)
    post_ok(server, "/slots/0?action=restore", {"filename": "with-image.bin"})
    again = native(server, 3)
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["tokens"] == first["tokens"]
    post_ok(server, "/slots/0?action=restore", {"filename": "with-image.bin"})
    assert native(server, 4, n_predict=1)["timings"]["cache_n"] < n_prompt - 1 - IMAGE_TOKENS["qwen"]


def test_file_urls_under_the_media_path(servers):
    server = servers["qwen"]
    local = post_ok(server, "/v1/chat/completions", chat_body("file://seven.png"))
    inline = post_ok(server, "/v1/chat/completions", chat_body(data_url(png(7))))
    assert local["choices"][0]["message"]["content"] == inline["choices"][0]["message"]["content"]


def error(server, path: str, body: dict) -> str:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    return r.json()["error"]["message"]


BAD_URLS = {
    "not-base64": ("data:image/png;base64,@@@@", "Invalid base64 value"),
    "not-an-image": (data_url(b"<html>hi</html>"), "Failed to load image or audio file"),
    "cut-short": (data_url(png(1)[:120]), "Failed to load image or audio file"),
    "not-image-type": ("data:text/html;base64,aGVsbG8=", "Invalid uri format: data:text/html"),
    "not-base64-uri": ("data:image/png,abc", "uri must be base64 encoded"),
    "two-commas": ("data:image/png;base64,a,b", "Invalid uri-encoded base64 value"),
    "remote": ("https://example.com/cat.png", "remote image URLs are not fetched"),
    "escape": ("file://../secret.png", "file path is not allowed"),
    "absent": ("file://nothing.png", "file does not exist or cannot be opened"),
}


@pytest.mark.parametrize("case", sorted(BAD_URLS))
def test_bad_images_are_400_and_the_server_goes_on(servers, case):
    url, message = BAD_URLS[case]
    assert error(servers["qwen"], "/v1/chat/completions", chat_body(url)).startswith(message)
    assert post_ok(servers["qwen"], "/v1/chat/completions", chat_body(data_url(png(7)), max_tokens=1))


def test_a_huge_image_is_refused_from_its_header(servers):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buf, format="PNG")  # ~10 KB of file, 81 megapixels of canvas
    assert "9000x9000 pixels" in error(servers["gemma"], "/v1/chat/completions", chat_body(data_url(buf.getvalue())))


def test_other_refusals(servers):
    gemma, qwen = servers["gemma"], servers["qwen"]
    assert error(gemma, "/v1/chat/completions", chat_body("file://seven.png")).startswith(
        "file:// URLs are not allowed unless --media-path is specified")
    audio = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]}
    assert error(qwen, "/v1/chat/completions", audio).startswith("audio input is not supported")
    mismatch = {"prompt": {"prompt_string": "no marker here", "multimodal_data": [base64.b64encode(png(1)).decode()]}}
    assert error(qwen, "/completion", mismatch) == ("number of media markers in text (0) does not match number of "
                                                    "bitmaps (1)")
    document = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hi"}}]}]}
    assert "document blocks are not supported" in error(qwen, "/v1/messages", document)
    assert error(qwen, "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_file", "file_id": "f"}]}]}).startswith("'input_file' is not supported")


def test_counting_tokens_counts_the_images(servers):
    server = servers["qwen"]
    body = chat_body(data_url(png(7)))
    counted = post_ok(server, "/v1/chat/completions/input_tokens", body)["input_tokens"]
    served = post_ok(server, "/v1/chat/completions", {**body, "max_tokens": 1})["usage"]["prompt_tokens"]
    assert counted == served


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Playwright, as ``test_webui.py`` drives it (skipped, saying so, without it)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (make setup-test installs it)")
    if not os.access("/usr/bin/chromium", os.X_OK):
        pytest.skip("no Chromium at /usr/bin/chromium: scripts/setup.sh installs Debian's chromium package")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


def test_the_page_attaches_an_image(browser, servers, tmp_path):
    """On a model that reads images the page offers an image button: the chosen image is shown, sent as an
    ``image_url`` part with the message, and the reply is the one the API gives for that image."""
    from server_process import REPO

    server = servers["gemma"]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                      {"type": "image_url", "image_url": {"url": data_url(png(7))}}]}],
            "max_tokens": 6, "temperature": 0}
    answer = post_ok(server, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    page = browser.new_context(viewport={"width": 1200, "height": 820}, bypass_csp=True).new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent !== '…'")
    assert page.is_visible("#attach")
    for field, value in (("temperature", "0"), ("max_tokens", "6")):
        page.click("#settings-button")
        page.fill(f"#{field}", value)
        page.dispatch_event(f"#{field}", "change")
        page.click("#settings-close")
    page.set_input_files("#image", files=[{"name": "seven.png", "mimeType": "image/png", "buffer": png(7)}])
    page.wait_for_selector("#attachments .thumb img")
    page.fill("#input", QUESTION)
    page.click("#send")
    page.wait_for_selector(".msg.user .images img")
    page.wait_for_function("() => { const c = JSON.parse(localStorage.getItem('mlxcel.conversations') || '[]'); "
                           "return c.length && c[0].messages.at(-1).done; }", timeout=120_000)
    sent, reply = json.loads(page.evaluate("localStorage.getItem('mlxcel.conversations')"))[0]["messages"]
    assert sent["images"] == [data_url(png(7))] and sent["content"] == QUESTION
    assert not reply.get("error") and reply["content"] == answer
    assert page.inner_text("#attachments") == ""  # sent: the composer is cleared
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(REPO / "test-artifacts" / "vision-page.png"), full_page=True)
    assert not errors
