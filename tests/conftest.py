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
