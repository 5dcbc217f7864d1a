"""A model that cannot be split the way a distributed ``mlxcel generate`` asks: the other split mode
when that one works (with a one-line notice), else one ``error:`` line and no traceback.

The split choice is checked in this process on MLX's group of one (the checks that refuse a split
look at the model's family and the request, not at how many ranks there are); the command line's
output needs two real ranks of ``mlx.launch``, so that part is slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
import tiny_checkpoints
from distributed_process import launcher
from server_process import REPO, server_env

from mlxcel.drafters.loading import load_target
from mlxcel.engine.distributed.split_choice import SplitRefused, falling_back_sharder

PROMPT = "a b c d e f g a b c d e f g"


@pytest.fixture(scope="module")
def tiny_mamba_dir(checkpoints_root) -> Path:
    """mlx-lm's mamba has neither tensor-parallel sharding nor pipeline support."""
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-mamba", "mamba", seed=4)


@pytest.fixture
def mlx_layers(monkeypatch):
    """What a distributed rank loads with: MLX's own linear layers, which mlx-lm can shard."""
    monkeypatch.setenv("MLXCEL_WEIGHTS", "quantized")


def test_a_model_neither_mode_can_split_is_refused_in_one_line(tiny_mamba_dir, mlx_layers):
    notices: list[str] = []
    with pytest.raises(SplitRefused) as refused:
        load_target(tiny_mamba_dir, shard=falling_back_sharder(mx.distributed.init(), "row", None, notices.append))
    message = str(refused.value)
    assert "--split-mode row" in message and "--split-mode layer" in message and "mamba" in message
    assert "\n" not in message and "try --split-mode" not in message  # both modes were tried: no advice to
    assert notices == []


def test_the_mode_that_works_is_used_with_a_notice(tiny_llama_dir, mlx_layers):
    """mlx-lm's llama has tensor-parallel sharding but no pipeline: asked for layers, it is split by rows."""
    notices: list[str] = []
    loaded = load_target(tiny_llama_dir, shard=falling_back_sharder(mx.distributed.init(), "layer", None,
                                                                    notices.append))
    assert len(notices) == 1 and "split by row" in notices[0] and "pipeline" in notices[0], notices
    projection = loaded.model.model.layers[0].self_attn.q_proj
    assert "Sharded" in type(projection).__name__, type(projection)
    whole = load_target(tiny_llama_dir)  # on a group of one the split model is the whole model
    prompt = mx.array([[1, 2, 3, 4]])
    assert mx.allclose(loaded.model(prompt), whole.model(prompt), atol=1e-4).item()


def _generate(*prefix: str, model: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).with_name("mlxcel")), "generate", "-m", str(model), "-p", PROMPT, "-n", "8",
           "--temp", "0", "--no-chat-template", *extra]
    return subprocess.run([*prefix, *cmd], cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_across_ranks_an_unsplittable_model_is_one_line_and_a_fallback_is_noted(tiny_mamba_dir, tiny_llama_dir):
    out = _generate(*launcher(2), model=tiny_mamba_dir)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot be split across 2 ranks" in errors[0], out.stderr[-3000:]
    assert "exited with code 1" in out.stderr  # mlx.launch's report of rank 0 (its own status is 0)

    one = _generate(model=tiny_llama_dir)
    split = _generate(*launcher(2), model=tiny_llama_dir, extra=("--split-mode", "layer"))
    assert one.returncode == 0 and split.returncode == 0, split.stderr[-3000:]
    notes = [line for line in split.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "split by row" in notes[0], split.stderr[-3000:]
    assert split.stdout.split("[Performance]")[0] == one.stdout.split("[Performance]")[0]
