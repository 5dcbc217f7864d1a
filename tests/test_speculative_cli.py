"""``mlxcel generate`` with a drafter, as a real subprocess on tiny checkpoints: the text equals
plain decoding's, the report lines appear on stdout, refusals are one ``error:`` line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

MLXCEL = str(Path(sys.executable).with_name("mlxcel"))
ARGS = ["-p", "The quick brown fox", "-n", "24", "--no-chat-template", "--ignore-eos"]


def generate(*argv, env=None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_SPECULATIVE")}
    full_env.update(env or {})
    return subprocess.run([MLXCEL, "generate", *argv], capture_output=True, text=True, env=full_env, timeout=120)


def text_of(stdout: str) -> str:
    return stdout.split("[Performance]")[0]


@pytest.fixture(scope="module")
def plain_greedy(tiny_llama_dir):
    r = generate("-m", str(tiny_llama_dir), *ARGS, "--temp", "0")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_draft_model_greedy_run_prints_the_plain_text_and_the_report(tiny_llama_dir, tiny_qwen_dir, plain_greedy):
    r = generate("-m", str(tiny_llama_dir), "--draft-model", str(tiny_qwen_dir), *ARGS, "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == text_of(plain_greedy)
    lines = r.stdout.splitlines()
    assert lines[-2].startswith("[Performance] ")
    assert re.match(r"^\[Speculative acceptance\] rule=greedy-argmax rounds=\d+ proposed=\d+ positions_tested=\d+ "
                    r"accepted=\d+ per_position_acceptance=\d\.\d{4} acceptance_rate=\d\.\d{4} "
                    r"mean_accepted_len=\d+\.\d{4} \(.+\)$", lines[-1])
    assert "Resolved drafter kind: dflash (block_size = 16, default)" in r.stderr
    assert "Traceback" not in r.stderr


def test_opt_in_rule_and_diagnostic_line(tiny_llama_dir, tiny_qwen_dir):
    env = {"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "on", "MLXCEL_SPECULATIVE_ACCEPT_DIAG": "1"}
    r = generate("-m", str(tiny_llama_dir), "--draft-model", str(tiny_qwen_dir), *ARGS, "--temp", "0.8",
                 "--seed", "5", env=env)
    assert r.returncode == 0, r.stderr
    assert "[Speculative acceptance] rule=stochastic " in r.stdout
    m = re.search(r"^\[Speculative acceptance diagnostic\] closed_form_sum_min=(\d\.\d{4}) "
                  r"closed_form_sum_prod=(\d\.\d{4}) \(", r.stdout, re.M)
    assert m and float(m.group(1)) >= float(m.group(2))


def test_prompt_lookup_run_adds_its_counters_line(tiny_llama_dir, plain_greedy):
    r = generate("-m", str(tiny_llama_dir), "--prompt-lookup", "--prompt-lookup-max", "4", *ARGS, "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == text_of(plain_greedy)
    assert "[Speculative acceptance] rule=greedy-argmax " in r.stdout
    assert r.stdout.splitlines()[-1].startswith("[Prompt lookup] ngram=1..4 ")


@pytest.mark.parametrize("extra", [["--draft-kind", "dflash"]])  # without it: tests/test_drafters_kinds.py
def test_a_dflash_drafter_is_refused_up_front(tiny_llama_dir, tmp_path, extra):
    d = tmp_path / "dflash"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["DFlashDraftModel"]}))
    r = generate("-m", str(tiny_llama_dir), "--draft-model", str(d), *ARGS, *extra)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "mlxcel-server" in errors[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_switch_value_is_one_error_line(tiny_llama_dir):
    r = generate("-m", str(tiny_llama_dir), "--prompt-lookup", *ARGS, env={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "2"})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT")
