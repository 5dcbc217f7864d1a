"""Bad GGUF input gives one clear ModelLoadError, never a stray exception from numpy/mlx/gguf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_gguf
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.errors import ModelLoadError, UnsupportedQuantError
from mlxcel.engine.model.gguf_loader import load_gguf
from mlxcel.engine.model.loading import load_model


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory, tiny_llama_dir) -> Path:
    return tiny_gguf.write_gguf(tiny_llama_dir, tmp_path_factory.mktemp("bad") / "good.gguf")


def test_the_good_file_loads(good_gguf):
    assert load_gguf(good_gguf).config["model_type"] == "llama"


@pytest.mark.parametrize("keep", [100, 5000, 0.6])
def test_truncated_file(good_gguf, tmp_path, keep):
    data = good_gguf.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(path)


def test_garbage_with_gguf_suffix(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a model at all\n" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(path)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_gguf(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError):
        load_gguf(path)


def test_corrupt_header_counts(good_gguf, tmp_path):
    data = bytearray(good_gguf.read_bytes())
    data[16:24] = (2**62).to_bytes(8, "little")  # metadata count
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt"):
        load_gguf(path)


def test_unknown_architecture_is_named(tiny_llama_dir, tmp_path):
    path = tiny_gguf.write_gguf(tiny_llama_dir, tmp_path / "mamba.gguf", architecture="mamba")
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'mamba'"):
        load_model(path)


def test_unsupported_quant_type_names_tensor_and_type(tiny_qwen_dir, tmp_path):
    # The tiny qwen2 ties its head to the embeddings, so an output.weight can be added.
    block, size = GGML_QUANT_SIZES[Q.Q8_1]  # a type used for activations only; no decoder exists
    raw = np.zeros((384, 64 // block * size), dtype=np.uint8)
    path = tiny_gguf.write_gguf(tiny_qwen_dir, tmp_path / "q8_1.gguf", extra_tensors={"output.weight": (raw, Q.Q8_1)})
    with pytest.raises(UnsupportedQuantError, match=r"'output\.weight' uses ggml type Q8_1"):
        load_model(path)


def test_unknown_type_id(good_gguf, tmp_path):
    """A tensor whose ggml type id is not one llama.cpp defines."""
    from mlxcel.engine.gguf.file import read_gguf

    data = bytearray(good_gguf.read_bytes())
    info = read_gguf(good_gguf)
    name = next(iter(info.tensors)).encode()
    at = data.index(name, 24) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    data[type_at:type_at + 4] = (250).to_bytes(4, "little")
    path = tmp_path / "type250.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedQuantError, match="unknown ggml type id 250"):
        load_gguf(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError):
        load_gguf(tmp_path / "nope.gguf")
