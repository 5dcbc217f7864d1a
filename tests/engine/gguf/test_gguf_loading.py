"""GGUF loading against the same weights loaded from a Hugging Face directory by mlx-lm.

Every tiny GGUF comes with its *effective* checkpoint (what its stored values decode to, see
``tiny_gguf``), so float and quantized files alike must reproduce mlx-lm's logits."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny_checkpoints
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.gguf.file import read_gguf
from mlxcel.engine.gguf.names import gguf_name
from mlxcel.engine.gguf.tensors import PACKED_TYPES, affine_triplet, dequantize_numpy, llama_qk_rows
from mlxcel.engine.model.loading import default_model_path, load_model
from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.packed_modules import PackedEmbedding, PackedLinear
from mlxcel.engine.platform.settings import switched

PROMPT = "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b"
MIXED = tiny_gguf.mixed({
    "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0, "attn_output": Q.Q5_0,
    "ffn_gate": Q.Q5_1, "ffn_up": Q.F16, "ffn_down": Q.Q4_0, "token_embd": Q.Q8_0, "output.": Q.Q4_1,
})
KQUANTS = tiny_gguf.mixed({"attn_q": Q.Q4_K, "attn_k": Q.Q6_K, "attn_v": Q.Q4_K, "ffn_": Q.Q6_K,
                           "token_embd": Q.Q6_K, "output.": Q.Q4_K, "attn_output": Q.Q8_0})


@pytest.fixture(scope="module")
def gguf_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf")


def _pair(hf_dir: Path, root: Path, tag: str, types) -> tuple[Path, Path]:
    gguf_path = tiny_gguf.write_gguf(hf_dir, root / f"{tag}.gguf", types, effective_dir=root / f"{tag}-effective")
    return gguf_path, root / f"{tag}-effective"


def _logits(loaded, text: str = PROMPT) -> mx.array:
    ids = loaded.tokenizer.encode(text)
    return loaded.model(mx.array([ids]))[0].astype(mx.float32)


def _weights(mode: str):
    """Load with ``MLXCEL_WEIGHTS=mode`` (``float32``: the exactly dequantized path)."""
    return switched(weights=mode)


def _assert_same_model(gguf_path: Path, hf_dir: Path, atol: float = 1e-4) -> None:
    with _weights("float32"):
        ours = load_model(gguf_path)
    ref = load_model(hf_dir)
    assert ours.source == "gguf" and ref.source == "mlx"
    a, b = _logits(ours), _logits(ref)
    assert a.shape == b.shape
    diff = mx.abs(a - b).max().item()
    assert diff <= atol, f"max |logit difference| {diff}"
    assert mx.array_equal(a.argmax(-1), b.argmax(-1)), "greedy tokens differ"
    if qmatmul.available():
        _assert_packed_matches(gguf_path, ours)


def _assert_packed_matches(gguf_path: Path, floats) -> None:
    """The CPU kernels' load of the same file (the default on a CPU): every packed matrix
    dequantizes to the float path's weights bitwise (types the kernels run as stored) or within
    Q8_0's rounding (re-packed types), and the logits follow within the 8-bit activations' error."""
    packed = load_model(gguf_path)
    file = read_gguf(gguf_path)
    blocks = int(file.metadata[f"{file.architecture}.block_count"])
    modules = dict(packed.model.named_modules())
    reference = dict(floats.model.named_modules())
    seen = 0
    for path, module in modules.items():
        if not isinstance(module, (PackedLinear, PackedEmbedding)):
            continue
        seen += 1
        got = qmatmul.dequantize(module.weight_spec)
        want = reference[path].weight
        stored = file.tensors[gguf_name(file.architecture, blocks, f"{path}.weight")].qtype
        if stored in PACKED_TYPES:
            assert mx.array_equal(got, want), path
        else:  # re-packed to Q8_0: half a step of 8-bit rounding per block of 32, plus the f16 step size
            step = mx.abs(want.reshape(want.shape[0], -1, 32)).max(-1, keepdims=True) / 127
            err = mx.abs(got - want).reshape(step.shape[0], -1, 32)
            assert bool(mx.all(err <= step * (0.5 + 127 * 2.0**-11) + 1e-7).item()), path
    if not seen:
        return
    a, b = _logits(packed), _logits(floats)
    scale = float(mx.abs(b).max().item())
    assert mx.abs(a - b).max().item() <= 0.05 * scale, "packed logits drift from the float path"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_gguf_matches_hf_checkpoint(arch, gguf_root, tiny_llama_dir, tiny_qwen_dir):
    hf_dir = tiny_llama_dir if arch == "llama" else tiny_qwen_dir
    gguf_path = tiny_gguf.write_gguf(hf_dir, gguf_root / f"{arch}-f32.gguf")
    _assert_same_model(gguf_path, hf_dir)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_quant_gguf_matches_its_effective_checkpoint(arch, gguf_root, tiny_llama_dir, tiny_qwen_dir):
    hf_dir = tiny_llama_dir if arch == "llama" else tiny_qwen_dir
    gguf_path, effective = _pair(hf_dir, gguf_root, f"{arch}-mixed", MIXED)
    types = load_model(gguf_path).metadata["tensor_types"]
    assert {"Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "F16", "F32"} <= set(types)
    _assert_same_model(gguf_path, effective)


def test_kquant_gguf_matches_its_effective_checkpoint(gguf_root):
    # K-quant blocks hold 256 values per row chunk: needs a model 256 wide.
    hf_dir = tiny_checkpoints.build_hf_checkpoint(gguf_root / "llama-256", "llama", seed=3, hidden=256)
    gguf_path, effective = _pair(hf_dir, gguf_root, "llama-kquant", KQUANTS)
    assert {"Q4_K", "Q6_K"} <= set(load_model(gguf_path).metadata["tensor_types"])
    _assert_same_model(gguf_path, effective)


def test_quantized_layers_kept_when_policy_says_so(gguf_root, tiny_llama_dir, monkeypatch):
    gguf_path, effective = _pair(tiny_llama_dir, gguf_root, "llama-keep", MIXED)
    monkeypatch.setenv("MLXCEL_WEIGHTS", "quantized")
    ours = load_model(gguf_path)
    layer = ours.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear) and layer.self_attn.q_proj.bits == 4
    assert isinstance(layer.self_attn.v_proj, nn.QuantizedLinear) and layer.self_attn.v_proj.bits == 8
    assert layer.self_attn.q_proj.group_size == 32
    assert isinstance(ours.model.model.embed_tokens, nn.QuantizedEmbedding)
    # Q5_0 is MLX's 5-bit affine layout (engine/gguf/mlx_quant.py).
    assert isinstance(layer.self_attn.o_proj, nn.QuantizedLinear) and layer.self_attn.o_proj.bits == 5
    monkeypatch.delenv("MLXCEL_WEIGHTS")
    ref = load_model(effective)
    a, b = _logits(ours), _logits(ref)
    assert mx.abs(a - b).max().item() <= 1e-3
    assert mx.array_equal(a.argmax(-1), b.argmax(-1))


def test_skipping_the_qk_unpermute_changes_the_model(gguf_root, tiny_llama_dir):
    """The F32 comparison above can fail: the GGUF's raw q/k row order gives other logits."""
    gguf_path = tiny_gguf.write_gguf(tiny_llama_dir, gguf_root / "llama-perm.gguf")
    loaded = load_model(gguf_path)
    good = _logits(loaded)
    tiny_gguf.permute_qk_in_place(loaded.model, loaded.config)
    assert mx.abs(_logits(loaded) - good).max().item() > 1e-2


def test_unpermute_inverts_convert_permutation():
    w = np.arange(9 * 64 * 3).reshape(9 * 64, 3)
    gguf_rows = tiny_gguf.llama_permute(w, 9)
    assert np.array_equal(gguf_rows[llama_qk_rows(9 * 64, 9)], w)
    assert not np.array_equal(gguf_rows, w)


def test_config_from_metadata(tiny_qwen_dir, tiny_llama_dir, gguf_root):
    llama = load_model(tiny_gguf.write_gguf(tiny_llama_dir, gguf_root / "cfg-llama.gguf"))
    qwen = load_model(tiny_gguf.write_gguf(tiny_qwen_dir, gguf_root / "cfg-qwen.gguf"))
    assert llama.config["model_type"] == "llama" and qwen.config["model_type"] == "qwen2"
    assert llama.config["tie_word_embeddings"] is False and qwen.config["tie_word_embeddings"] is True
    for loaded, hf_dir in ((llama, tiny_llama_dir), (qwen, tiny_qwen_dir)):
        ref = load_model(hf_dir).config
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "rope_theta", "vocab_size", "max_position_embeddings"):
            assert loaded.config[key] == ref[key], key
        assert loaded.config["rms_norm_eps"] == pytest.approx(ref["rms_norm_eps"])
        assert loaded.metadata["add_bos"] is False and loaded.add_bos is False
        assert loaded.chat_template == tiny_checkpoints.CHATML_TEMPLATE
        assert loaded.eos_token_ids == {0, 2}  # eos <|im_end|>, plus <|endoftext|> as llama.cpp counts it


def test_block_conversion_matches_mlx_and_gguf_references():
    """Our Q4_1/Q8_0 -> MLX triplets equal mx.load's own GGUF reader bit for bit, and their
    float32 dequantization equals the gguf package's reference decoder."""
    path = default_model_path()
    native = mx.load(str(path))
    stored = read_gguf(path).tensors
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.7.ffn_down.weight"):
        info = stored[name]
        w, s, b = affine_triplet(info)
        stem = name[: -len(".weight")]
        assert np.array_equal(w, np.array(native[name]))
        assert np.array_equal(s, np.array(native[f"{stem}.scales"]))
        assert np.array_equal(b, np.array(native[f"{stem}.biases"]))
        bits = 8 if info.qtype == Q.Q8_0 else 4
        ours = mx.dequantize(mx.array(w), mx.array(s).astype(mx.float32), mx.array(b).astype(mx.float32),
                             group_size=32, bits=bits)
        assert np.array_equal(np.array(ours), dequantize_numpy(info))


def test_q4_0_conversion_matches_gguf_reference(gguf_root):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 96)).astype(np.float32)
    path = gguf_root / "q4_0.gguf"
    from gguf import GGUFWriter, quants

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("x.weight", quants.quantize(w, Q.Q4_0), raw_dtype=Q.Q4_0)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    info = read_gguf(path).tensors["x.weight"]
    tw, ts, tb = affine_triplet(info)
    ours = mx.dequantize(mx.array(tw), mx.array(ts).astype(mx.float32), mx.array(tb).astype(mx.float32),
                         group_size=32, bits=4)
    assert np.array_equal(np.array(ours), dequantize_numpy(info))
    native = mx.load(str(path))
    assert np.array_equal(tw, np.array(native["x.weight"]))


def _llama3_rope_factors(base: float, dims: int, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The per-frequency divisors a converter stores as ``rope_freqs`` for Llama 3.x scaling."""
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * np.pi * base ** (i / dims)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_freqs_match_hf_llama3_scaling(gguf_root):
    import json

    hf_dir = tiny_checkpoints.build_hf_checkpoint(gguf_root / "llama3-rope", "llama", seed=4)
    config = json.loads((hf_dir / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    (hf_dir / "config.json").write_text(json.dumps(config))
    factors = _llama3_rope_factors(config["rope_theta"], 16, 8.0, 1.0, 4.0, 64)
    assert len(set(factors.tolist())) > 2  # some dims unscaled, some scaled, some smoothed
    with_freqs = tiny_gguf.write_gguf(hf_dir, gguf_root / "llama3-rope.gguf",
                                      extra_tensors={"rope_freqs.weight": (factors, Q.F32)})
    text = PROMPT * 3  # long enough for the low frequencies to matter
    ours, ref = load_model(with_freqs), load_model(hf_dir)
    a, b = _logits(ours, text), _logits(ref, text)
    assert mx.abs(a - b).max().item() <= 1e-4
    without = load_model(tiny_gguf.write_gguf(hf_dir, gguf_root / "llama3-norope.gguf"))
    assert mx.abs(_logits(without, text) - b).max().item() > 1e-3


def test_qwen3_gguf_matches_hf_checkpoint(gguf_root):
    hf_dir = tiny_gguf.build_qwen3_checkpoint(gguf_root / "qwen3", seed=5)
    gguf_path = tiny_gguf.write_gguf(hf_dir, gguf_root / "qwen3.gguf")
    assert load_model(gguf_path).config["head_dim"] == 32  # not hidden / heads = 16
    _assert_same_model(gguf_path, hf_dir)
