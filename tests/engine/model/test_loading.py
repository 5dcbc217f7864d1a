"""Loading MLX / Hugging Face directories, the default model, and bad input."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loading import default_model_path, load_model
from mlxcel.engine.platform import device, qmatmul


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen"])
def test_directory_checkpoint_loads_and_runs(fixture, request):
    loaded = request.getfixturevalue(fixture)
    assert loaded.source == "mlx"
    ids = loaded.tokenizer.encode("Hello world")
    logits = loaded.model(mx.array([ids]))
    assert logits.shape == (1, len(ids), loaded.vocab_size)
    assert bool(mx.all(mx.isfinite(logits)).item())
    # On this CPU every weight runs in float32 (engine/platform/device.py): the matrices as the
    # kernels' float32 tiles (uint8 arrays of packed type F32) where the kernels are built.
    params = tree_flatten(loaded.model.parameters())
    assert {v.dtype for n, v in params if not n.endswith(".packed")} == {mx.float32}
    packed = [m for _, m in loaded.model.named_modules() if hasattr(m, "_spec")]
    assert all(m._spec[0] == qmatmul.F32 for m in packed)
    assert bool(packed) == device.float_kernels()


def test_chat_template_and_eos(tiny_llama):
    ids = tiny_llama.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    text = tiny_llama.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert tiny_llama.eos_token_ids == {tiny_llama.tokenizer.convert_tokens_to_ids("<|im_end|>")}


@pytest.mark.parametrize("weights", ["float32", "default"])
def test_quantized_directory_on_cpu(tiny_llama_dir, tmp_path, weights, monkeypatch):
    """A quantized MLX checkpoint loads; on the CPU its layers are packed for the quantized
    kernels (the default, where they are built) or become float32 (``MLXCEL_WEIGHTS=float32``),
    and the outputs follow the quantized model's: exactly its weights when dequantized, within
    the 8-bit activations' rounding when packed."""
    if weights == "float32":
        monkeypatch.setenv("MLXCEL_WEIGHTS", "float32")
    elif not qmatmul.available():
        pytest.skip("the CPU kernels are not built here")
    from mlx_lm.utils import load as mlx_lm_load
    from mlx_lm.utils import quantize_model, save_model

    model, _, config = mlx_lm_load(str(tiny_llama_dir), return_config=True)
    qmodel, qconfig = quantize_model(model, config, group_size=32, bits=8)
    out = tmp_path / "q8"
    shutil.copytree(tiny_llama_dir, out)
    (out / "model.safetensors").unlink()
    save_model(out, qmodel)
    (out / "config.json").write_text(json.dumps(qconfig))
    loaded = load_model(out)
    names = [n for n, _ in tree_flatten(loaded.model.parameters())]
    assert not any(n.endswith(".scales") for n in names)
    # dequantized to float32, the layers run as the float kernel's tiles (type F32) where it is on
    kinds = {m._spec[0] for _, m in loaded.model.named_modules() if hasattr(m, "_spec")}
    assert bool(kinds - {qmatmul.F32}) == (weights == "default")
    ids = loaded.tokenizer.encode("def add(a, b):")
    ref = qmodel(mx.array([ids]))[0, -1]
    got = loaded.model(mx.array([ids]))[0, -1]
    tol = 1e-3 if weights == "float32" else 0.05 * float(mx.abs(ref).max().item())
    assert float(mx.abs(ref - got).max().item()) < tol


def test_bad_paths(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(junk)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_unsupported_architecture(tiny_llama_dir, tmp_path):
    out = tmp_path / "weird"
    shutil.copytree(tiny_llama_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["model_type"] = "definitely_not_a_model"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_model(out)


def test_default_model_is_shipped():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
