"""The fused CPU norm / rope / attention (engine/platform/fused_layers.py) against MLX's own ops,
and what they are for: with them and the quantized kernels, a block forward of a packed model is
bitwise the same as one-token forwards, so the exactness probe allows block verification."""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import qmatmul
from mlxcel.engine.platform.fused_layers import (
    FusedRMSNorm,
    FusedRoPE,
    RowwiseLinear,
    fuse_layers,
    restore_attention,
)
from mlxcel.engine.speculative.exactness_probe import probe

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")


def close(a, b, tol=2e-5):
    return float(mx.abs(a - b).max().item()) <= tol * max(1.0, float(mx.abs(b).max().item()))


def test_ops_match_mlx():
    ext = qmatmul.extension()
    key = mx.random.key(0)
    x = mx.random.normal((2, 4, 5, 64), key=key)
    w = mx.random.normal((64,), key=mx.random.key(1))
    assert close(ext.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5))
    assert close(ext.rms_norm(mx.swapaxes(x, 1, 2), w, 1e-6), mx.fast.rms_norm(mx.swapaxes(x, 1, 2), w, 1e-6))
    for traditional in (False, True):
        for offset in (0, 37):
            got = ext.rope(mx.swapaxes(x, 1, 2), 48, traditional, 10000.0, 0.5, offset)  # strided, partial dims
            want = mx.fast.rope(mx.swapaxes(x, 1, 2), 48, traditional=traditional, base=10000.0, scale=0.5,
                                offset=offset)
            assert close(got, want), (traditional, offset)
    q = mx.random.normal((2, 6, 3, 64), key=mx.random.key(2))
    k = mx.random.normal((2, 2, 11, 64), key=mx.random.key(3))
    v = mx.random.normal((2, 2, 11, 64), key=mx.random.key(4))
    for mask in (None, "causal"):
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        assert close(ext.attention(q, k, v, 0.125, mask == "causal"), want), mask
    gate = mx.concatenate([mx.random.normal((2, 3, 700), key=mx.random.key(5)) * 8,
                           mx.linspace(-120, 120, 2 * 3 * 100).reshape(2, 3, 100)], axis=-1)
    up = mx.random.normal(gate.shape, key=mx.random.key(6))
    assert close(ext.swiglu(gate, up), nn.silu(gate) * up)
    assert mx.array_equal(ext.swiglu(mx.swapaxes(gate, 0, 1), mx.swapaxes(up, 0, 1)),
                          mx.swapaxes(ext.swiglu(gate, up), 0, 1))  # strided inputs read in place
    kt = mx.swapaxes(mx.swapaxes(k, 1, 2), 1, 2)  # a strided view, as a cache slice is
    assert close(ext.attention(q, kt, v, 0.125, True), mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125,
                                                                                            mask="causal"))


class _Heads(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.one = nn.Linear(k, 1, bias=False)  # Qwen3-Next's shared-expert gate
        self.three = nn.Linear(k, 3)
        self.wide = nn.Linear(k, 64)  # packed at load (float32 tiles), not swapped

    def __call__(self, x):
        return [self.one(x), self.three(x)]


def width_dependent_rows(module, x) -> list[int]:
    """Widths w in 2..8 at which a forward of x's first w rows differs (bitwise) from those rows of
    the 8-row forward."""
    full = module(x)
    return [w for w in range(2, 9)
            if not all(mx.array_equal(a[:, :w], b).item() for a, b in zip(full, module(x[:, :w]), strict=True))]


def test_narrow_float_linears_give_a_row_the_same_bits_at_any_width():
    """A float linear with a few outputs stays on MLX's matmul (``pack_float_modules`` leaves it),
    which OpenBLAS answers with rounding that depends on the number of rows (under
    ``scripts/with-blas``: widths 2, 3 and more differ here); ``fuse_layers`` swaps it for one that
    does not (zero tolerance), leaves a wide one alone, and computes the same function."""
    for k in (64, 576, 2048):
        heads = _Heads(k)
        x = mx.random.normal((1, 8, k), key=mx.random.key(k))
        plain = heads(x)
        assert fuse_layers(heads)["rowwise_linear"] == 2
        assert type(heads.one) is RowwiseLinear and type(heads.three) is RowwiseLinear
        assert type(heads.wide) is nn.Linear
        assert width_dependent_rows(heads, x) == [], k
        for a, b in zip(heads(x), plain, strict=True):
            assert close(a, b)


@pytest.fixture(scope="module")
def packed_tiny(tmp_path_factory, tiny_llama_dir):
    path = tiny_gguf.write_gguf(tiny_llama_dir, tmp_path_factory.mktemp("fused") / "q.gguf",
                                tiny_gguf.mixed({"token_embd": Q.Q8_0, "": Q.Q4_1}))
    return load_model(path)


def test_packed_model_is_fused_and_block_exact(packed_tiny):
    model = packed_tiny.model
    kinds = {type(m) for _, m in model.named_modules()}
    assert FusedRMSNorm in kinds and FusedRoPE in kinds
    assert getattr(sys.modules[type(model).__module__].swiglu, "mlxcel_fused", False)
    for width in (2, 5, 9, 16):
        verdict = probe(model, width, vocab_size=packed_tiny.vocab_size, make_cache=packed_tiny.make_cache)
        assert verdict.exact, verdict.describe()


def test_without_the_fused_ops_blocks_are_not_exact(packed_tiny, monkeypatch):
    """The probe above can fail: with MLX's own norm/rope/attention the same packed weights give
    block forwards that differ from one-token forwards in the last bits."""
    monkeypatch.setenv("MLXCEL_FUSED_OPS", "0")
    restore_attention()
    try:
        plain = load_model(packed_tiny.path)
        kinds = {type(m) for _, m in plain.model.named_modules()}
        verdicts = [probe(plain.model, w, vocab_size=plain.vocab_size, make_cache=plain.make_cache) for w in (5, 9, 16)]
    finally:
        fuse_layers(packed_tiny.model)
    assert FusedRMSNorm not in kinds
    assert not all(v.exact for v in verdicts)


def test_without_the_kernels_the_float32_path_runs_and_says_so(packed_tiny, tmp_path):
    """No kernels (here: ``MLXCEL_CPU_KERNELS=0``, as when no compiler was found at install): the
    same file loads as float32, and one log line says why."""
    import subprocess
    import sys

    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from mlx.utils import tree_flatten\n"
            "from mlxcel.engine.model.loading import load_model\n"
            f"lm = load_model({str(packed_tiny.path)!r})\n"
            "print('PACKED', any(n.endswith('.packed') for n, _ in tree_flatten(lm.model.parameters())))\n")
    env = {**__import__("os").environ, "MLXCEL_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "PACKED False" in out
    assert out.count("CPU quantized kernels unavailable (MLXCEL_CPU_KERNELS=0)") == 1


def test_wide_row_code_gives_the_same_bits_split_among_threads():
    """The norm, rope, SwiGLU and activation quantization of a wide call (a prompt chunk) split their
    rows among the kernel threads: every row, or element, the bits one thread gives."""
    ext = qmatmul.extension()
    x = mx.random.normal((200, 3, 64), key=mx.random.key(7)) * 3
    w = mx.random.normal((192,), key=mx.random.key(8))
    gate = mx.random.normal((200, 1536), key=mx.random.key(9)) * 6
    up = mx.random.normal((200, 1536), key=mx.random.key(10))
    positions = mx.array([(i * 7) % 301 for i in range(200)], dtype=mx.int32)
    raw = mx.random.randint(0, 256, (1536, 6 * 20), key=mx.random.key(11)).astype(mx.uint8)  # Q4_1: 20 B a block
    raw = raw.reshape(1536, 6, 20)
    scales = (mx.random.normal((1536, 6, 2), key=mx.random.key(12)) * 0.02).astype(mx.float16).view(mx.uint8)
    raw = mx.concatenate([scales, raw[..., 4:]], axis=-1).reshape(1536, -1)
    packed = qmatmul.pack_gguf(raw, 3, 1536, 192)

    def outputs():
        flat = x.reshape(200, 192)
        out = [ext.rms_norm(flat, w, 1e-5), ext.rope_positions(x, positions, 48, False, 10000.0, 1.0),
               ext.rope_positions(x, positions[::-1], 64, True, 500.0, 0.5), ext.swiglu(gate, up),
               qmatmul.qmatmul(flat, packed)]
        mx.eval(out)
        return out

    before = qmatmul.set_thread_split(1, 0)
    threads = ext.num_threads()
    try:
        qmatmul.set_threads(1)
        alone = outputs()
        qmatmul.set_threads(2)
        split = outputs()
    finally:
        qmatmul.set_threads(threads)
        qmatmul.set_thread_split(*before)
    for a, b in zip(alone, split, strict=True):
        assert mx.array_equal(a, b).item()
    assert close(alone[0], mx.fast.rms_norm(x.reshape(200, 192), w, 1e-5))
    assert close(alone[3], nn.silu(gate) * up)
