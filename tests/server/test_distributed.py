"""mlxcel-server across two ranks of ``mlx.launch`` (ring backend on 127.0.0.1), against a
single-process server on the same tiny checkpoint: greedy tokens identical (alone, under batching,
with prompt lookup, with a draft model; tensor and pipeline parallel; llama and qwen2), a killed
rank ends the open request with an error, and the startup check refuses ranks that loaded
different models."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import tiny_checkpoints
from distributed_process import distributed_server, launcher, rank_pids, stop_all
from server_process import REPO, ServerProcess, post_ok, server_env

pytestmark = pytest.mark.slow

PROMPTS = [
    "a b c d e f g a b c d e f g a b c d e f g a b c",
    "The cat sat. The cat sat. The cat sat. The",
    "1 2 3 4 1 2 3 4 1 2 3 4 1 2",
]
N = 16


@pytest.fixture(scope="module")
def draft_dir(checkpoints_root):
    # the same tokenizer as the tiny targets (build_tokenizer is deterministic), other weights
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "dist-draft", "llama", seed=3, layers=1)


def body(prompt: str, **fields) -> dict:
    return {"prompt": prompt, "n_predict": N, "temperature": 0, "ignore_eos": True, "return_tokens": True, **fields}


def tokens(server: ServerProcess, prompt: str, **fields) -> tuple[list[int], dict]:
    out = post_ok(server, "/completion", body(prompt, **fields))
    return out["tokens"], out["timings"]


def concurrent_tokens(server: ServerProcess, **fields) -> list[list[int]]:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda p: tokens(server, p, **fields)[0], PROMPTS))


@pytest.fixture(scope="module", params=["llama-draft", "qwen2-lookup", "qwen2-layers"])
def pair(request, tiny_llama_dir, tiny_qwen_dir, draft_dir):
    """(single-process server, two-rank server, whether requests speculate) for one setup."""
    family, how = request.param.split("-")
    model = tiny_llama_dir if family == "llama" else tiny_qwen_dir
    common = ["-m", str(model), "-np", "3", "-ub", "8", "-v"]
    if how == "draft":
        common += ["-md", str(draft_dir), "--spec-draft-n-max", "3"]
    elif how == "lookup":
        common += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "4"]
    split = ["--split-mode", "layer"] if how == "layers" else []
    single = ServerProcess(*common)
    try:
        dist = distributed_server(*common, *split)
    except Exception:
        single.stop()
        raise
    try:
        yield single, dist, how in ("draft", "lookup")
    finally:
        single.stop()
        stop_all(dist)


def test_greedy_tokens_identical_to_one_process(pair):
    single, dist, speculates = pair
    drafted = 0
    for p in PROMPTS:
        a, _ = tokens(single, p)
        b, timings = tokens(dist, p)
        assert a == b and len(a) == N, p
        drafted += timings.get("draft_n", 0)
        # and plainly decoded (no drafter) on both
        assert tokens(single, p, **{"speculative.n_max": 0})[0] == tokens(dist, p, **{"speculative.n_max": 0})[0] == a
    assert (drafted > 0) == speculates  # the verify rounds really ran in the sharded forward


def test_greedy_tokens_identical_under_batching(pair):
    single, dist, _ = pair
    expected = [tokens(single, p)[0] for p in PROMPTS]
    assert concurrent_tokens(dist) == expected
    assert concurrent_tokens(dist, **{"speculative.n_max": 0}) == expected
    assert post_ok(dist, "/completion", body("x y z", n_predict=2))["tokens_predicted"] == 2  # still serving


def test_killed_rank_ends_the_open_request_with_an_error(tiny_llama_dir):
    dist = distributed_server("-m", str(tiny_llama_dir), "-np", "2", "-v", "--timeout", "60")
    try:
        pids = rank_pids(dist)
        assert set(pids) == {0, 1}
        start = time.monotonic()
        events = []
        with httpx.stream("POST", dist.url + "/completion", timeout=60,
                          json={"prompt": "hello", "n_predict": 100000, "ignore_eos": True, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                if len(events) == 3:
                    subprocess.run(["kill", "-9", str(pids[1])], check=True)
        assert time.monotonic() - start < 60
        assert "error" in events[-1], events[-1]
        assert "rank" in events[-1]["error"]["message"] or "shutting down" in events[-1]["error"]["message"]
        dist.proc.wait(timeout=30)  # the server stops
    finally:
        stop_all(dist)


def test_ranks_with_different_models_are_refused_at_startup(tiny_llama_dir, draft_dir):
    # rank 1 loads another checkpoint than rank 0: both stop before serving, saying so
    script = (f"import os, sys; from mlxcel.server.cli.main import server_main; "
              f"m = {str(tiny_llama_dir)!r} if os.environ['MLX_RANK'] == '0' else {str(draft_dir)!r}; "
              f"sys.exit(server_main(['-m', m, '--port', '0']))")
    out = subprocess.run([*launcher(2), sys.executable, "-c", script], cwd=REPO, env=server_env(),
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "loaded a different model and settings than rank 0" in text, text[-3000:]


def test_refused_command_lines(tiny_llama_dir):
    out = subprocess.run([*launcher(2), sys.executable, "-m", "mlxcel.server.cli", "-m", str(tiny_llama_dir),
                          "--embeddings"], cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=120)
    assert "--embeddings / --reranking are not served across ranks" in out.stdout + out.stderr



@pytest.mark.parametrize("extra", [(), ("--draft-kind", "prompt-lookup")])
def test_generate_across_ranks_prints_the_single_process_text(tiny_qwen_dir, extra):
    cmd = [str(Path(sys.executable).with_name("mlxcel")), "generate", "-m", str(tiny_qwen_dir), "-p", PROMPTS[0],
           "-n", str(N), "--temp", "0", "--no-chat-template", *extra]

    def text(*prefix: str) -> str:
        out = subprocess.run([*prefix, *cmd], cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split("[Performance]")[0]

    one = text()
    assert one.strip() and text(*launcher(2)) == one
