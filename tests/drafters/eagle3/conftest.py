"""Tiny checkpoints the EAGLE-3 tests share, built once per session: a qwen3 target (four layers),
EAGLE-3 drafters for it in each on-disk form (``tiny_eagle3``), and a diffuse target/drafter pair
for the distribution tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_drafters
import tiny_eagle3

PROMPT = "The quick brown fox jumps over the lazy dog. The quick"


@pytest.fixture(scope="session")
def e3_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("eagle3")


@pytest.fixture(scope="session")
def e3_target_dir(e3_root) -> Path:
    return tiny_drafters.build_target(e3_root / "qwen3", "qwen3", seed=3)


@pytest.fixture(scope="session")
def e3_target(e3_target_dir):
    from mlxcel.engine.model.loading import load_model

    return load_model(e3_target_dir)


@pytest.fixture(scope="session")
def e3_dirs(e3_root, e3_target_dir) -> dict[str, Path]:
    """One drafter per form: the authors' layout (own layer ids, a 256-token draft vocabulary), the
    speculators layout (the default layer trio, own embeddings, a block of 4), its GGUF conversion,
    and an echo drafter (full vocabulary) whose drafts a looping greedy stream accepts."""
    original = tiny_eagle3.build_eagle3(e3_root / "eagle3", e3_target_dir, layout="eagle3")
    speculators = tiny_eagle3.build_eagle3(e3_root / "speculators", e3_target_dir, layout="speculators", aux_ids=None,
                                           own_embeddings=True, block=4, seed=22)
    return {
        "eagle3": original,
        "speculators": speculators,
        "gguf": tiny_eagle3.write_eagle3_gguf(original, e3_target_dir, e3_root / "eagle3.gguf"),
        "echo": tiny_eagle3.build_eagle3(e3_root / "echo", e3_target_dir, draft_vocab=None, echo=True),
    }


@pytest.fixture(scope="session")
def e3_diffuse(e3_root):
    """A target and drafter with diffuse, overlapping p and q (the stochastic rule accepts often and
    rejects often); the draft vocabulary is most of the target's."""
    from mlxcel.engine.model.loading import load_model

    target = load_model(tiny_drafters.build_target(e3_root / "diffuse", "qwen3", seed=3, logit_scale=0.08))
    drafter = tiny_eagle3.build_eagle3(e3_root / "diffuse-d", target.path, draft_vocab=320, logit_scale=0.05, seed=23)
    return target, drafter
