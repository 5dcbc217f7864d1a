"""Shared fixtures: tiny real checkpoints built on disk once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_checkpoints


@pytest.fixture(scope="session")
def checkpoints_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tiny_llama_dir(checkpoints_root) -> Path:
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama", "llama", seed=1)


@pytest.fixture(scope="session")
def tiny_qwen_dir(checkpoints_root) -> Path:
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-qwen2", "qwen2", seed=2)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    from mlxcel.engine.model.loading import load_model

    return load_model(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_qwen(tiny_qwen_dir):
    from mlxcel.engine.model.loading import load_model

    return load_model(tiny_qwen_dir)


@pytest.fixture(scope="session")
def hybrid_dirs(checkpoints_root) -> dict[str, Path]:
    """Tiny targets whose caches hold recurrent state, in their published layouts (tiny_drafters):
    Qwen3.5 and Qwen3-Next (gated-delta layers, with MTP layers), LFM2 (short convolutions)."""
    import tiny_drafters

    return {arch: tiny_drafters.build_target(checkpoints_root / f"hybrid-{arch}", arch, seed=3)
            for arch in ("qwen3_5", "qwen3_next", "lfm2")}


@pytest.fixture(scope="session")
def hybrid(hybrid_dirs):
    from mlxcel.engine.model.loading import load_model

    return {arch: load_model(d) for arch, d in hybrid_dirs.items()}
