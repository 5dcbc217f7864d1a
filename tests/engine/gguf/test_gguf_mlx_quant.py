"""GGUF types kept quantized on the MLX-native path (``engine/gguf/mlx_quant.py``).

Exact types must dequantize to gguf-py's reference bit for bit with float32 scales, and within
the rounding of each group's scale and bias to float16 on the MLX-native path; re-quantized types
within half a step of their MLX layout, and under the relative RMS error docs/gguf-architectures.md
gives. Tiny models that together hold every type (one per matrix) must then pick the greedy tokens
of the same file decoded exactly, on the MLX-native path (``MLXCEL_WEIGHTS=quantized
MLXCEL_DTYPE=float16``, MLX's own quantized modules, mlxcel's CPU kernels off), every matrix in its
type's MLX layout; MoE files keep their stacked experts quantized."""

from __future__ import annotations

from pathlib import Path

import gguf_convert
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny_archs
import tiny_checkpoints
import tiny_gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

from mlxcel.engine.gguf.file import TensorInfo, read_gguf
from mlxcel.engine.gguf.mlx_quant import LAYOUTS, pack_codes, to_quantized
from mlxcel.engine.gguf.names import gguf_name
from mlxcel.engine.model.loading import load_model

NATIVE = {"MLXCEL_WEIGHTS": "quantized", "MLXCEL_DTYPE": "float16", "MLXCEL_CPU_KERNELS": "0"}
FLOAT32 = {"MLXCEL_WEIGHTS": "float32", "MLXCEL_DTYPE": "float32"}
EXACT = [t for t, layout in LAYOUTS.items() if layout.exact]
REQUANTIZED = [t for t, layout in LAYOUTS.items() if not layout.exact]
# Relative RMS error of each re-quantized type on these random blocks (seed 0, 64 x 1024), rounded
# up from docs/gguf-architectures.md's table: a worse re-quantizer fails here.
REL_RMS_LIMIT = {
    Q.Q6_K: 0.015, Q.Q3_K: 0.03, Q.Q2_K: 0.04, Q.IQ4_NL: 0.015, Q.IQ4_XS: 0.015, Q.IQ3_XXS: 0.03,
    Q.IQ3_S: 0.01, Q.IQ2_XXS: 0.03, Q.IQ2_XS: 0.06, Q.IQ2_S: 0.06, Q.IQ1_S: 0.001, Q.IQ1_M: 0.12,
    Q.TQ1_0: 0.001, Q.TQ2_0: 0.001,
}
N_TOKENS = 8
MATRICES = (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)
TIE = 0.01  # of the float model's logit standard deviation: a tie at float16
PROMPT = "def add(a, b):"
HALF_ULP, F32_ULP, HALF_TINY = 2.0 ** -11, 2.0 ** -23, 2.0 ** -25


def _switch(monkeypatch, values: dict[str, str]) -> None:
    """Set the ``MLXCEL_*`` switches to ``values``, every other one this module uses unset
    (``monkeypatch`` makes the process read them again)."""
    for name in set(NATIVE) | set(FLOAT32):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def _tensor(qtype: Q, rows: int = 64, cols: int = 1024, seed: int = 0) -> TensorInfo:
    rng = np.random.default_rng(seed)
    if qtype in tiny_gguf.ENCODABLE:
        raw = quants.quantize((0.02 * rng.standard_normal((rows, cols))).astype(np.float32), qtype)
    else:
        raw = tiny_gguf.random_blocks(rows, cols, qtype, rng)
    return TensorInfo(name="x.weight", qtype=qtype, shape=(rows, cols), data=raw)


def _per_element(groups: mx.array) -> np.ndarray:
    """A per-group array (rows, cols / 32) repeated over each group's 32 elements."""
    return np.repeat(np.array(groups.astype(mx.float32)), 32, axis=-1)


@pytest.mark.parametrize("qtype", EXACT, ids=lambda t: t.name)
def test_exact_types_dequantize_to_the_gguf_reference(qtype):
    info = _tensor(qtype)
    ref = quants.dequantize(info.data, qtype).astype(np.float32)
    exact = to_quantized(info, mx.float32)
    assert exact.bits == LAYOUTS[qtype].bits and exact.mode == LAYOUTS[qtype].mode
    assert np.array_equal(np.array(exact.dequantize(mx.float32)), ref), "float32 scales must be bit-exact"

    half = to_quantized(info, mx.float16)
    got = np.array(half.dequantize(mx.float32))
    if exact.mode != "affine":  # MXFP4: power-of-two scales, nothing to round
        assert np.array_equal(got, ref)
        return
    # Rounding s and b to float16 moves s q + b by at most 2^-11 (q |s| + |b|), or 2^-25 per term
    # where they are subnormal; float32 evaluation adds 2^-23 of the magnitude. Codes <= 2^bits - 1.
    top = 2 ** exact.bits - 1
    s, b = np.abs(_per_element(exact.scales)), np.abs(_per_element(exact.biases))
    bound = (HALF_ULP + F32_ULP) * (top * s + b) + (top + 1) * HALF_TINY
    assert np.all(np.abs(got - ref) <= bound)


@pytest.mark.parametrize("qtype", REQUANTIZED, ids=lambda t: t.name)
def test_requantized_types_stay_within_half_a_step(qtype):
    info = _tensor(qtype)
    ref = quants.dequantize(info.data, qtype).astype(np.float32)
    w = to_quantized(info, mx.float16)
    assert (w.bits, w.mode) == (LAYOUTS[qtype].bits, "affine")
    got = np.array(w.dequantize(mx.float32))
    # Nearest code of the stored step: half a step, plus the stored bias's float16 rounding.
    s, b = np.abs(_per_element(w.scales)), np.abs(_per_element(w.biases))
    bound = s / 2 + HALF_ULP * b + HALF_TINY + F32_ULP * ((2 ** w.bits - 1) * s + b)
    err = got - ref
    assert np.all(np.abs(err) <= bound)
    assert np.sqrt((err ** 2).mean() / (ref ** 2).mean()) <= REL_RMS_LIMIT[qtype]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packed_codes_read_back_through_mlx(bits):
    codes = np.random.default_rng(bits).integers(0, 2 ** bits, size=(3, 96), dtype=np.uint8)
    packed = mx.array(pack_codes(codes, bits))
    ones, zeros = mx.ones((3, 3)), mx.zeros((3, 3))
    assert np.array_equal(np.array(mx.dequantize(packed, ones, zeros, group_size=32, bits=bits)), codes)


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory) -> Path:
    """One layer with rows of 256 (and 512 in the MLP), so every block type, K-quants included,
    fits."""
    return tiny_checkpoints.build_hf_checkpoint(tmp_path_factory.mktemp("wide") / "llama-256", "llama",
                                                seed=3, hidden=256, layers=1)


def _greedy(loaded, ids: list[int], n: int) -> tuple[list[int], mx.array]:
    """``n`` greedy tokens after ``ids``, one cached step at a time, and the logits of each step."""
    cache, tokens, logits = loaded.make_cache(), [], []
    x = mx.array([ids])
    for _ in range(n):
        logits.append(loaded.model(x, cache=cache)[0, -1].astype(mx.float32))
        tokens.append(int(mx.argmax(logits[-1]).item()))
        x = mx.array([[tokens[-1]]])
    return tokens, mx.stack(logits)


# Tiny models that hold every type of LAYOUTS, one type per matrix (a model per type costs a
# second and a half each here, most of it MLX's float16 quantized matmul on a CPU). The exact
# types fill the whole model; the re-quantized ones fill the layer, the embedding and head staying
# F32: in a model of random codes those two carry all of its signal, and a few percent of error
# there flips its flat logits (they are the same quantized modules the exact types check).
MODELS = {
    "exact": {"token_embd": Q.Q8_0, "output.": Q.Q4_K, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q5_0,
              "attn_output": Q.Q5_1, "ffn_gate": Q.MXFP4, "ffn_up": Q.Q4_K, "ffn_down": Q.Q5_K},
    "k-and-iq4": {"attn_q": Q.Q6_K, "attn_k": Q.Q3_K, "attn_v": Q.Q2_K, "attn_output": Q.IQ4_NL,
                  "ffn_gate": Q.IQ4_XS, "ffn_up": Q.IQ3_XXS, "ffn_down": Q.IQ3_S},
    "iq-and-ternary": {"attn_q": Q.IQ2_XXS, "attn_k": Q.IQ2_XS, "attn_v": Q.IQ2_S, "attn_output": Q.IQ1_S,
                       "ffn_gate": Q.IQ1_M, "ffn_up": Q.TQ1_0, "ffn_down": Q.TQ2_0},
}


def test_the_models_cover_every_type():
    assert {t for types in MODELS.values() for t in types.values()} == set(LAYOUTS)


@pytest.mark.parametrize("model", list(MODELS))
def test_greedy_tokens_match_the_dequantized_model(model, wide_llama, tmp_path, monkeypatch):
    """The file loaded on the MLX-native path picks, along the greedy tokens of the same file
    loaded exactly dequantized (float32), the same token at every step, or one the float model
    rates within 1% of its logits' spread of its own pick (a tie at float16). Every matrix must
    arrive in its type's MLX layout. The native side runs the whole sequence in one forward:
    MLX's float16 quantized matmul is slow on a CPU."""
    path = tiny_gguf.write_gguf(wide_llama, tmp_path / "m.gguf", tiny_gguf.mixed(MODELS[model]))
    _switch(monkeypatch, FLOAT32)
    reference = load_model(path)
    ids = reference.tokenizer.encode(PROMPT)
    want, logits = _greedy(reference, ids, N_TOKENS)
    _switch(monkeypatch, NATIVE)
    ours = load_model(path)
    got = ours.model(mx.array([ids + want[:-1]]))[0, len(ids) - 1:].argmax(-1).tolist()
    stored = read_gguf(path).tensors
    matrices = [(n, m) for n, m in ours.model.named_modules() if isinstance(m, MATRICES)]
    assert len(matrices) == 9
    for name, module in matrices:
        qtype = stored[gguf_name("llama", 1, f"{name}.weight")].qtype
        if qtype == Q.F32:
            assert type(module) in (nn.Linear, nn.Embedding), name
        else:
            layout = LAYOUTS[qtype]
            assert (module.bits, module.group_size, module.mode) == (layout.bits, 32, layout.mode), name
    for step, (mine, theirs) in enumerate(zip(got, want)):
        gap = (logits[step, theirs] - logits[step, mine]).item()
        assert gap <= TIE * mx.std(logits[step]).item(), f"step {step}: {mine} instead of {theirs} ({gap:.3f} apart)"


@pytest.mark.parametrize("case_id, qtype", [("gpt-oss", Q.MXFP4), ("deepseek-v2", Q.Q8_0)])
def test_moe_models_load_quantized(case_id, qtype, tmp_path, monkeypatch):
    """Stacked experts stay quantized (mlx-lm's ``QuantizedSwitchLinear``; gpt-oss as released,
    MXFP4, in MLX's mxfp4 mode), and a quantized matrix whose module cannot hold quantized weights
    (DeepSeek's router gate, a bare parameter) is dequantized rather than failing the load; the
    logits follow the exactly dequantized load of the same file."""
    case = tiny_archs.CASES[case_id]
    tiny_archs.build(case, tmp_path / "hf", seed=11)
    path = gguf_convert.convert(tmp_path / "hf", tmp_path / "moe.gguf", case.gguf_arch, qtype=qtype)
    ids = [(7 * i + 3) % 380 + 3 for i in range(24)]
    _switch(monkeypatch, NATIVE)
    ours = load_model(path)
    logits = ours.model(mx.array([ids]))[0].astype(mx.float32)
    experts = [m for _, m in ours.model.named_modules() if type(m).__name__ == "QuantizedSwitchLinear"]
    layout = LAYOUTS[qtype]
    assert experts and {(m.bits, m.mode) for m in experts} == {(layout.bits, layout.mode)}
    _switch(monkeypatch, FLOAT32)
    ref = load_model(path).model(mx.array([ids]))[0]
    assert mx.array_equal(logits.argmax(-1), ref.argmax(-1))
    assert mx.abs(logits - ref).max().item() <= 0.02 * mx.abs(ref).max().item()
