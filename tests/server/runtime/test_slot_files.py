"""Slot files on a real server: a saved, erased and restored slot continues token for token as the
uninterrupted slot does (and reuses the restored prefix); file names cannot leave the directory,
and every name upstream accepts (up to 255 bytes) saves; upstream's bodies and errors, which never
show the server's directory."""

from __future__ import annotations

import threading

import httpx
import pytest
from server_process import ServerProcess, post_ok

from mlxcel.server.runtime.slot_files import valid_filename

PROMPT = "Once upon a time there was a little robot who loved to count"


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(tiny_llama_dir, save_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "-np", "2", "-c", "1024", "--temp", "0",
                         "--slot-save-path", str(save_dir))
    yield proc
    proc.stop()


def action(server, slot, what, body=None) -> httpx.Response:
    return httpx.post(f"{server.url}/slots/{slot}?action={what}", json=body or {}, timeout=120)


def complete(server, prompt, slot, n=8) -> dict:
    return post_ok(server, "/completion", {"prompt": prompt, "id_slot": slot, "n_predict": n, "cache_prompt": True,
                                           "return_tokens": True})


def test_save_erase_restore_continues_as_uninterrupted(server, save_dir):
    first = complete(server, PROMPT, 1)
    prompt_tokens = httpx.post(server.url + "/tokenize", json={"content": PROMPT}).json()["tokens"]
    held = len(prompt_tokens) + len(first["tokens"]) - 1  # the last sampled token was never fed
    saved = action(server, 1, "save", {"filename": "slot1.bin"})
    assert saved.status_code == 200, saved.text
    body = saved.json()
    assert body["id_slot"] == 1 and body["filename"] == "slot1.bin" and body["n_saved"] == held
    assert body["n_written"] == (save_dir / "slot1.bin").stat().st_size > 0
    assert set(body["timings"]) == {"save_ms"}

    follow = prompt_tokens + first["tokens"]  # the conversation goes on from where slot 1 stopped
    uninterrupted = complete(server, follow, 1, n=12)
    assert uninterrupted["timings"]["cache_n"] == held

    erased = action(server, 1, "erase")
    assert erased.status_code == 200 and erased.json()["id_slot"] == 1 and erased.json()["n_erased"] > 0
    assert complete(server, PROMPT, 1, n=1)["timings"]["cache_n"] == 0  # nothing left to reuse

    restored = action(server, 0, "restore", {"filename": "slot1.bin"})
    assert restored.status_code == 200, restored.text
    body = restored.json()
    assert body["n_restored"] == held and body["n_read"] == (save_dir / "slot1.bin").stat().st_size
    assert set(body["timings"]) == {"restore_ms"} and body["id_slot"] == 0
    again = complete(server, follow, 0, n=12)
    assert again["timings"]["cache_n"] == held
    assert again["timings"]["prompt_n"] == len(follow) - held
    assert again["tokens"] == uninterrupted["tokens"]
    assert again["content"] == uninterrupted["content"]


@pytest.mark.parametrize("name", ["../escape.bin", "a/b.bin", "..", ".", "", " lead", "trail.", "trail ",
                                  "a:b", "back\\slash", "x\u2215y", "ctrl\x01", "q?", "/etc/passwd", "a..b",
                                  "x" * 256])
def test_traversal_and_bad_names_are_refused(server, save_dir, name):
    r = action(server, 0, "save", {"filename": name})
    assert r.status_code == 400 and r.json()["error"] == {"code": 400, "message": "Invalid filename",
                                                          "type": "invalid_request_error"}
    assert not valid_filename(name)
    assert not (save_dir.parent / "escape.bin").exists()


def test_valid_names():
    for name in ("slot1.bin", "my slot.state", "état-🙂.bin", ".hidden", "x" * 255):
        assert valid_filename(name), name


def test_an_empty_slot_saves_and_restores_empty(server):
    assert action(server, 1, "erase").status_code == 200
    saved = action(server, 1, "save", {"filename": "empty.bin"}).json()
    assert saved["n_saved"] == 0 and saved["n_written"] > 0
    restored = action(server, 0, "restore", {"filename": "empty.bin"})
    assert restored.status_code == 200 and restored.json()["n_restored"] == 0, restored.text


def test_bad_requests(server):
    assert action(server, 0, "restore", {"filename": "missing.bin"}).json()["error"]["message"].startswith(
        "Unable to restore slot: ")
    assert complete(server, PROMPT, 0, n=2)["timings"]["cache_n"] == 0  # the slot stays usable, emptied
    for slot, what, message in ((0, "foo", "Invalid action"), ("x", "save", "Invalid slot ID"),
                                (99, "erase", "Invalid slot ID")):
        r = action(server, slot, what, {"filename": "f.bin"})
        assert r.status_code == 400 and r.json()["error"]["message"] == message, r.text
    r = action(server, 0, "save", {})
    assert r.status_code == 400


def test_save_waits_for_a_busy_slot(server):
    """An action on a busy slot waits until its request ends (upstream defers it)."""
    results = {}

    def long_request():
        results["completion"] = complete(server, PROMPT + " again", 0, n=400)

    worker = threading.Thread(target=long_request)
    worker.start()
    saved = None
    while worker.is_alive():  # as soon as the request holds the slot (however long it takes to start)
        slots = httpx.get(server.url + "/slots").json()
        if slots[0]["is_processing"]:
            saved = action(server, 0, "save", {"filename": "busy.bin"})
            break
    worker.join()
    assert saved is not None and saved.status_code == 200, saved
    done = results["completion"]
    assert saved.json()["n_saved"] == done["tokens_evaluated"] + done["tokens_predicted"] - 1


def test_a_name_of_255_bytes_saves_and_restores(server, save_dir):
    """The file system's limit on a name is 255 bytes: the temporary file beside it must not add to it."""
    name = "é" * 100 + "x" * 51 + ".bin"  # 255 bytes of UTF-8
    assert len(name.encode()) == 255
    saved = action(server, 1, "save", {"filename": name})
    assert saved.status_code == 200 and saved.json()["filename"] == name, saved.text
    restored = action(server, 1, "restore", {"filename": name})
    assert restored.status_code == 200 and restored.json()["n_read"] == (save_dir / name).stat().st_size
    assert not [p.name for p in save_dir.iterdir() if "tmp" in p.name]  # no temporary file left behind


def test_errors_never_show_the_servers_directory(server, save_dir):
    (save_dir / "garbage.bin").write_bytes(b"not a slot file at all")
    (save_dir / "a-directory.bin").mkdir()
    for what, name in (("restore", "missing.bin"), ("restore", "garbage.bin"), ("restore", "a-directory.bin"),
                       ("save", "a-directory.bin")):
        r = action(server, 0, what, {"filename": name})
        assert r.status_code in (400, 500), r.text
        message = r.json()["error"]["message"]
        assert message.startswith(f"Unable to {what} slot"), message
        assert str(save_dir) not in r.text and str(save_dir.resolve()) not in r.text and "/" not in message, message
