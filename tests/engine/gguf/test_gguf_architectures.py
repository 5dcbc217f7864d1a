"""Every GGUF architecture mlxcel maps, against mlx-lm on the same weights.

For each family a tiny random model is drawn with mlx-lm's own class, saved as the Hugging Face
checkpoint it stands for (``tiny_archs``), and written to GGUF the way llama.cpp's converter lays
that checkpoint out (``gguf_convert``). The GGUF loaded by mlxcel must give mlx-lm's logits within
1e-4 on a prompt longer than every sliding window, and the same greedy tokens through the cache."""

from __future__ import annotations

from pathlib import Path

import gguf_convert
import mlx.core as mx
import pytest
import tiny_archs

from mlxcel.engine.model.loading import load_model

# long enough to cross the tiny sliding windows (8 tokens) several times
PROMPT_IDS = [(7 * i + 3) % 380 + 3 for i in range(40)]
N_GREEDY = 8


@pytest.fixture(scope="module")
def arch_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("archs")


def _greedy(model, ids: list[int], n: int, cache) -> list[int]:
    out, x = [], mx.array([ids])
    for _ in range(n):
        nxt = int(mx.argmax(model(x, cache=cache)[0, -1]).item())
        out.append(nxt)
        x = mx.array([[nxt]])
    return out


@pytest.mark.parametrize("case_id", sorted(tiny_archs.CASES))
def test_gguf_matches_mlx_lm(case_id: str, arch_root: Path):
    from mlx_lm.models.cache import make_prompt_cache

    case = tiny_archs.CASES[case_id]
    hf_dir = tiny_archs.build(case, arch_root / case_id, seed=11)
    path = gguf_convert.convert(hf_dir, arch_root / f"{case_id}.gguf", case.gguf_arch)
    ours = load_model(path)
    ref = tiny_archs.reference_model(case, hf_dir)
    assert ours.metadata["architecture"] == case.gguf_arch

    a = ours.model(mx.array([PROMPT_IDS]))[0].astype(mx.float32)
    b = ref(mx.array([PROMPT_IDS]))[0].astype(mx.float32)
    assert a.shape == b.shape
    diff = mx.abs(a - b).max().item()
    assert diff <= 1e-4, f"{case_id}: max |logit difference| {diff}"
    spread = (b.max(-1) - b.min(-1)).mean().item()
    assert spread > 1.0, f"{case_id}: the random model's logits are too flat to test ({spread})"

    ours_tokens = _greedy(ours.model, PROMPT_IDS, N_GREEDY, ours.make_cache())
    ref_tokens = _greedy(ref, PROMPT_IDS, N_GREEDY, make_prompt_cache(ref))
    assert ours_tokens == ref_tokens
