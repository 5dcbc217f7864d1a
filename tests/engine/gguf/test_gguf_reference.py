"""An independent reference for the GGUF loader: transformers' own GGUF reader (it dequantizes
with the gguf package and runs the model in torch). Needs the ``reference`` extra
(``pip install -e .[reference]``: torch CPU + accelerate); skipped, saying so, without torch."""

from __future__ import annotations

import importlib.util

import mlx.core as mx
import numpy as np
import pytest
import tiny_gguf

from mlxcel.engine.model.loading import default_model_path, load_model
from mlxcel.engine.platform.settings import switched

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("accelerate") is None,
    reason="transformers' GGUF reference needs torch and accelerate: pip install -e '.[reference]'",
)

PROMPT = "The capital of France is"


def _compare(gguf_path, prompt: str, n_new: int, atol: float = 1e-4) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    ref.eval()
    # the loader's exact path (dequantized float32); the CPU kernels' own checks are in test_qmatmul.py
    with switched(weights="float32"):
        ours = load_model(gguf_path)
    ids = ours.tokenizer.encode(prompt)
    with torch.no_grad():
        ref_tokens = ref.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        ref_logits = ref(torch.tensor([ids + ref_tokens])).logits[0].numpy()
    our_logits = np.array(ours.model(mx.array([ids + ref_tokens]))[0].astype(mx.float32))
    diff = float(np.abs(our_logits - ref_logits).max())
    assert diff <= atol, f"max |logit difference| vs transformers: {diff}"
    # Greedy tokens: ours chosen from our own logits at every step of the reference continuation.
    assert our_logits[len(ids) - 1:-1].argmax(-1).tolist() == ref_tokens


def test_tiny_llama_gguf_matches_transformers(tiny_llama_dir, tmp_path):
    path = tiny_gguf.write_gguf(tiny_llama_dir, tmp_path / "tiny-llama.gguf")
    _compare(path, "The quick brown fox jumps over", n_new=8)


@pytest.mark.slow
def test_smollm2_q4_1_matches_transformers():
    """~25 s on two shared cores (transformers' own GGUF dequantization dominates)."""
    _compare(default_model_path(), PROMPT, n_new=12)
