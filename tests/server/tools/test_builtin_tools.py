"""The built-in tools on real files and real processes: upstream's glob rules, edit_file's
matching (exact, fuzzy, unique, disjoint), the listing walk (junk directories listed but not
walked, depth, limit), read_file's ranges, shell commands with their timeout (the whole process
group ends) and streaming, and the isolates' command lines through a stand-in ``docker`` that runs
the command it is given locally."""

from __future__ import annotations

import os
import stat
import time

import pytest

from mlxcel.server.tools.builtin import EditFile, ExecShellCommand, FileGlobSearch, GrepSearch, ReadFile, ToolParamError
from mlxcel.server.tools.edit import EditError, apply_edits
from mlxcel.server.tools.glob import glob_match, path_glob_match
from mlxcel.server.tools.io import ToolRuntimeError, make_io, run_subprocess


def test_glob_rules_are_upstreams():
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "d/a.py")
    assert glob_match("**", "a/b/c") and glob_match("**/c", "a/c") and not glob_match("**/c", "c")
    assert glob_match("[!a]b", "cb") and not glob_match("[!a]b", "ab") and glob_match("[a-c]x", "bx")
    assert glob_match("a?c", "abc") and not glob_match("a?c", "a/c")
    assert path_glob_match("*.txt", "deep/er/x.txt")  # no slash: the basename at any depth
    assert path_glob_match("src/*.cpp", "lib/src/a.cpp") and not path_glob_match("src/*.cpp", "src/x/a.cpp")


def test_edit_rules():
    assert apply_edits("a\nb\nc\n", [("b", "B"), ("c\n", "c\nd\n")], "f") == "a\nB\nc\nd\n"
    with pytest.raises(EditError, match="unique"):
        apply_edits("dup\ndup\n", [("dup", "x")], "f")
    with pytest.raises(EditError, match="overlap"):
        apply_edits("l1\nl2\n", [("l1\nl2", "a"), ("l2", "b")], "f")
    with pytest.raises(EditError, match="could not find"):
        apply_edits("abc", [("zzz", "y")], "f")
    with pytest.raises(EditError, match="identical"):
        apply_edits("abc", [("b", "b")], "f")
    # a smart quote and trailing spaces in the file: matched fuzzily, untouched lines kept byte for byte
    original = "keep \u201cthis\u201d  \nsay \u2018hi\u2019   \nend\n"
    assert apply_edits(original, [("say 'hi'", "say 'bye'")], "f") == "keep \u201cthis\u201d  \nsay 'bye'\nend\n"


def test_listing_walk_depth_limit_and_junk(tmp_path):
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("x")
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "top.txt").write_text("t")
    (tmp_path / "a" / "mid.txt").write_text("m")
    (tmp_path / "a" / "b" / "deep.txt").write_text("d")
    tool = FileGlobSearch()
    everything = tool.invoke({"path": str(tmp_path), "type": "all"})
    paths = {e["path"]: e["type"] for e in everything["entries"]}
    assert paths["build"] == "dir" and "build/artifact.txt" not in paths and "build/nested" not in paths
    assert paths["a/b/deep.txt"] == "file" and everything["base"] == str(tmp_path)
    shallow = tool.invoke({"path": str(tmp_path), "max_depth": 2})["plain_text_response"]
    assert "mid.txt" in shallow and "deep.txt" not in shallow
    limited = tool.invoke({"path": str(tmp_path), "limit": 1})
    assert len(limited["entries"]) == 1 and "Total matches: 3" in limited["plain_text_response"]
    assert "invalid type" in tool.invoke({"path": str(tmp_path), "type": "bogus"})["error"]
    assert "invalid limit" in tool.invoke({"path": str(tmp_path), "limit": 0})["error"]


def test_read_and_grep(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("one\ntwo\nthree\n")
    assert ReadFile().invoke({"path": str(f), "start_line": 2, "end_line": 2})["plain_text_response"] == "two\n"
    assert ReadFile().invoke({"path": "f.txt", "cwd": str(tmp_path), "append_loc": True})["plain_text_response"] \
        == "1\u2192one\n2\u2192two\n3\u2192three\n"
    assert "cannot stat" in ReadFile().invoke({"path": str(tmp_path / "nope")})["error"]
    with pytest.raises(ToolParamError):
        ReadFile().invoke({})
    out = GrepSearch().invoke({"path": str(tmp_path), "pattern": "t(wo|hree)", "return_line_numbers": True})
    assert "f.txt:2:two" in out["plain_text_response"] and "Total matches: 2" in out["plain_text_response"]
    assert "invalid regex" in GrepSearch().invoke({"path": str(tmp_path), "pattern": "("})["error"]


def test_edit_file_tool_writes_and_refuses(tmp_path):
    f = tmp_path / "e.txt"
    f.write_text("x = 1\n")
    assert EditFile().invoke({"path": str(f), "edits": [{"old_text": "1", "new_text": "2"}]})["edits_applied"] == 1
    assert f.read_text() == "x = 2\n"
    assert "non-empty array" in EditFile().invoke({"path": str(f), "edits": []})["error"]


def test_shell_timeout_ends_the_process_group_and_streams():
    t0 = time.monotonic()
    # a background grandchild holds the output open; the group kill still ends the call at its timeout
    res = ExecShellCommand().invoke({"command": "sleep 30 & echo started; sleep 30", "timeout": 1})
    assert time.monotonic() - t0 < 10
    assert "started" in res["plain_text_response"] and "[exit due to timed out]" in res["plain_text_response"]
    chunks: list[str] = []
    def keep(chunk: str) -> bool:  # True: go on (False would end the command)
        chunks.append(chunk)
        return True

    assert ExecShellCommand().invoke({"command": "echo a; echo b >&2; exit 3"}, keep) is None
    text = "".join(chunks)
    assert "a\n" in text and "b\n" in text and text.endswith("[exit code: 3]")
    capped = run_subprocess(["sh", "-c", "head -c 100000 /dev/zero"], 10, 5)
    assert capped.raw == b"\0" * 10 and capped.output.endswith("[output truncated]")


def test_isolate_runtimes(tmp_path, monkeypatch):
    for bad, message in (("fake:x", "unknown tool runtime"), ("ssh:-oProxyCommand=x", "invalid ssh target"),
                         ("docker-container:--privileged", "invalid container id"),
                         ("podman:busybox", "must name a running container")):
        with pytest.raises(ToolRuntimeError, match=message):
            make_io({"runtime": bad})
    # a stand-in engine: `docker exec [-i] ID CMD...` runs CMD here, so every isolate command line runs for real
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = exec ] || exit 64\nshift\n[ "$1" = -i ] && shift\n'
                    '[ "$1" = cid1 ] || exit 65\nshift\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    params = {"runtime": "docker-container:cid1", "cwd": str(work)}
    io = make_io(params)
    assert io.write_file("sub/a.txt", b"in the box\n") and (work / "sub" / "a.txt").read_text() == "in the box\n"
    assert io.read_file("sub/a.txt") == b"in the box\n" and io.file_size("sub/a.txt") == 11
    assert io.is_directory("sub") and not io.is_regular_file("sub")
    listing = io.list_entries(str(work), 0, "all")
    assert ("sub", True) in listing.entries and ("sub/a.txt", False) in listing.entries
    res = ExecShellCommand().invoke({**params, "command": "pwd; cat sub/a.txt"})
    assert str(work) in res["plain_text_response"] and "in the box" in res["plain_text_response"]
