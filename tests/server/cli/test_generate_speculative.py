"""``mlxcel generate`` with a drafter, as a real subprocess on tiny checkpoints: every kind the
server runs (draft model, prompt lookup, DFlash, DSpark, MTP) runs here too, the text equals plain
decoding's, the report lines appear on stdout, refusals are one ``error:`` line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiny_drafters
import tiny_mtp
from server_process import ServerProcess, post_ok

MLXCEL = str(Path(sys.executable).with_name("mlxcel"))
ARGS = ["-p", "The quick brown fox", "-n", "24", "--no-chat-template", "--ignore-eos"]


def generate(*argv, env=None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT", "MLXCEL_SPECULATIVE_ACCEPT_DIAG")}
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
    assert "drafting with the draft model (draft-simple)" in r.stderr
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


@pytest.fixture(scope="module")
def model_drafted(tmp_path_factory):
    """A tiny qwen3 target with DFlash and DSpark drafters, and an MTP target."""
    root = tmp_path_factory.mktemp("cli-drafters")
    qwen3 = tiny_drafters.build_target(root / "qwen3", "qwen3", seed=3)
    diffuse = tiny_drafters.build_target(root / "diffuse", "qwen3", seed=3, logit_scale=0.08)
    return {"qwen3": qwen3, "dflash": tiny_drafters.build_dflash(root / "dflash", qwen3, layer_ids=(1, 3)),
            "dspark": tiny_drafters.build_dspark(root / "dspark", qwen3, layer_ids=(0, 2)),
            "diffuse": diffuse, "diffuse-dspark": tiny_drafters.build_dspark(root / "diffuse-dspark", diffuse),
            "mtp-target": tiny_mtp.build_mimo_target(root / "mimo")}


@pytest.fixture(scope="module")
def plain_text(model_drafted):
    """The plain greedy text on one of ``model_drafted``'s targets, generated once per target."""
    texts: dict[str, str] = {}

    def text(target: str) -> str:
        if target not in texts:
            r = generate("-m", str(model_drafted[target]), *ARGS, "--temp", "0", env=PROBE_PASS)
            assert r.returncode == 0, r.stderr
            texts[target] = text_of(r.stdout)
        return texts[target]

    return text


PROBE_PASS = {"MLXCEL_EXACTNESS_PROBE": "pass"}


def acceptance_rule(stdout: str) -> str:
    m = re.search(r"^\[Speculative acceptance\] rule=(\S+) rounds=(\d+) ", stdout, re.M)
    assert m, stdout
    assert int(m.group(2)) > 0, stdout  # it really drafted
    return m.group(1)


@pytest.mark.parametrize("how", [["--draft-kind", "dflash", "-md", "{dflash}"], ["-md", "{dflash}"],
                                 ["--spec-type", "draft-dspark", "-md", "{dspark}"]])
def test_the_dflash_round_loop_runs_on_generate(model_drafted, plain_text, how):
    argv = [a.format(**{k: str(v) for k, v in model_drafted.items()}) for a in how]
    r = generate("-m", str(model_drafted["qwen3"]), *argv, *ARGS, "--temp", "0", env=PROBE_PASS)
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == plain_text("qwen3")
    assert acceptance_rule(r.stdout) == "greedy-argmax"


def test_the_mtp_round_loop_runs_on_generate(model_drafted, plain_text):
    r = generate("-m", str(model_drafted["mtp-target"]), "--draft-kind", "mtp", *ARGS, "--temp", "0", env=PROBE_PASS)
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == plain_text("mtp-target")
    assert acceptance_rule(r.stdout) == "greedy-argmax"


def test_dspark_declines_a_sampling_request_to_plain_sampling(model_drafted, plain_text):
    """The decline must serve plain sampling, not the drafter's greedy stream: on this diffuse target
    a sample leaves the greedy path within the first tokens."""
    target = str(model_drafted["diffuse"])
    sampling = ["--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "11"]
    plain = generate("-m", target, *ARGS, *sampling, env=PROBE_PASS)
    r = generate("-m", target, "-md", str(model_drafted["diffuse-dspark"]), *ARGS, *sampling, env=PROBE_PASS)
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == text_of(plain.stdout)
    assert text_of(r.stdout) != plain_text("diffuse")
    assert r.stdout.splitlines()[-1].startswith("[Speculative acceptance] declined: the dspark drafter proposes "
                                                "greedy chains only")


def test_a_drafter_only_checkpoint_as_the_target_is_refused(tiny_llama_dir, tmp_path):
    d = tmp_path / "dflash"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["DFlashDraftModel"]}))
    r = generate("-m", str(d), *ARGS)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not a standalone model" in errors[0] and "-md DIR" in errors[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_switch_value_is_one_error_line(tiny_llama_dir):
    r = generate("-m", str(tiny_llama_dir), "--prompt-lookup", *ARGS, env={"MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT": "2"})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT")


def test_generate_and_the_server_emit_the_same_sampled_tokens(tiny_llama_dir, tiny_qwen_dir):
    """One session on both paths: the same sampled request through ``mlxcel generate`` and through
    a draft-model server gives the same text (position-keyed randomness, the same sampler and rule),
    and both really drafted."""
    sampling = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "min_p": 0.0, "seed": 21}
    r = generate("-m", str(tiny_llama_dir), "-md", str(tiny_qwen_dir), *ARGS, "--temp", "0.9", "--top-k", "20",
                 "--top-p", "0.95", "--min-p", "0", "--seed", "21")
    assert r.returncode == 0, r.stderr
    assert acceptance_rule(r.stdout) == "sampler-match"
    server = ServerProcess("-m", str(tiny_llama_dir), "-md", str(tiny_qwen_dir), "-np", "1")
    try:
        body = post_ok(server, "/completion", {"prompt": ARGS[1], "n_predict": 24, "ignore_eos": True, **sampling})
    finally:
        server.stop()
    assert body["content"] + "\n" == text_of(r.stdout)
    assert body["timings"]["draft_kind"] == "draft-model" and body["timings"]["draft_rounds"] > 0


@pytest.mark.slow  # in process, the same loop on hybrid targets: tests/drafters/test_hybrid_targets.py
def test_a_hybrid_target_speculates_with_its_own_mtp_layers(hybrid_dirs):
    """Qwen3.5 (gated-delta layers) with its MTP layers: the text is plain decoding's, the probe ran
    before the prompt (its line on stderr), the acceptance line follows the performance line."""
    target = str(hybrid_dirs["qwen3_5"])
    plain = generate("-m", target, *ARGS, "--temp", "0")
    r = generate("-m", target, "--draft-kind", "mtp", *ARGS, "--temp", "0", env={"MLXCEL_EXACTNESS_PROBE": "auto"})
    assert r.returncode == 0 and plain.returncode == 0, r.stderr
    assert text_of(r.stdout) == text_of(plain.stdout)
    assert "Exactness probe at load for the mtp drafter" in r.stderr
    assert r.stdout.splitlines()[-1].startswith("[Speculative acceptance] rule=greedy-argmax rounds=")


@pytest.mark.slow
def test_a_target_whose_state_cannot_be_restored_is_declined_on_generate(checkpoints_root):
    import tiny_checkpoints

    falcon = str(tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "gen-falcon-h1", "falcon_h1"))
    plain = generate("-m", falcon, *ARGS, "--temp", "0")
    r = generate("-m", falcon, "--prompt-lookup", *ARGS, "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert text_of(r.stdout) == text_of(plain.stdout)
    assert r.stdout.splitlines()[-1].startswith("[Speculative acceptance] declined: speculation needs the target's")
