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

from mlxcel.engine.gguf.file import read_gguf
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
    _check(case_id, arch_root)


@pytest.mark.parametrize("case_id", ["llama", "qwen2", "gemma3"])
def test_fused_qkv_gguf_matches_mlx_lm(case_id: str, arch_root: Path):
    """Files from the converter's ``--fuse-qkv``: one ``attn_qkv`` per layer, read back by rows."""
    _check(case_id, arch_root, fuse_qkv=True)


def _check(case_id: str, arch_root: Path, **convert) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    case = tiny_archs.CASES[case_id]
    hf_dir = arch_root / case_id
    if not (hf_dir / "config.json").exists():
        tiny_archs.build(case, hf_dir, seed=11)
    tag = "-".join([case_id, *sorted(convert)])
    path = gguf_convert.convert(hf_dir, arch_root / f"{tag}.gguf", case.gguf_arch, **convert)
    if convert.get("fuse_qkv"):
        assert "blk.0.attn_qkv.weight" in read_gguf(path).tensors
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
