"""The AMX path of the quantized kernel gives every row the VNNI kernel's bits, at every width.

AMX takes chunks of 4 to 16 rows through the tile unit and leaves narrower ones to the VNNI
kernel; a row's integer dot products are exact on both and its float epilogue is the same
sequence of operations, so the claim is bitwise equality, checked here for every packed type, at
widths that exercise full 16-row chunks, ragged remainders on both sides of the switch, and the
matrix walk tile by tile, at one and two threads. On a CPU (or a guest) without AMX the suite
checks only that the ISA is absent, and that MLXCEL_AMX=0 removes it where it is present.
"""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from quant_blocks import random_blocks

from mlxcel.engine.platform import qmatmul

pytestmark = pytest.mark.skipif(not qmatmul.available(), reason="the CPU kernels are not built here")


def has_amx() -> bool:
    return "amx" in qmatmul.extension().available_isas().split(",")


needs_amx = pytest.mark.skipif(not has_amx(), reason="no usable AMX on this CPU")


@pytest.fixture
def ext():
    e = qmatmul.extension()
    isa, threads = e.isa(), e.num_threads()
    split = qmatmul.set_thread_split(1, 0)  # every call split among the threads
    yield e
    qmatmul.set_thread_split(*split)
    e.set_isa(isa)
    e.set_num_threads(threads)


def weights(kind: str, n: int, k: int, seed: int) -> qmatmul.PackedWeight:
    if kind.startswith("affine"):
        bits, group = (4, 64) if kind == "affine4" else (8, 128)
        rng = np.random.default_rng(seed)
        wf = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(mx.bfloat16)
        wq, scales, biases = mx.quantize(wf, group_size=group, bits=bits)
        return qmatmul.pack_affine(wq, scales, biases, bits, group)
    qtype = Q[kind]
    return qmatmul.pack_gguf(random_blocks(qtype, n, k, seed=seed), int(qtype), n, k)


KINDS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "affine4", "affine8"]


@needs_amx
@pytest.mark.parametrize("kind", KINDS)
def test_amx_rows_equal_vnni_rows(kind, ext):
    n, k = 70, 768  # n not a multiple of the 16-feature tile; 3 K-quant super-blocks
    w = weights(kind, n, k, seed=len(kind))
    x = mx.array(np.random.default_rng(5).standard_normal((70, k)).astype(np.float32) * 3)
    for threads in (1, 2):
        ext.set_num_threads(threads)
        ext.set_isa("avx512_vnni")
        want = qmatmul.qmatmul(x, w)
        one = mx.concatenate([qmatmul.qmatmul(x[i:i + 1], w) for i in range(20)])
        mx.eval(want, one)  # the kernel is the one set when the graph is evaluated
        assert mx.array_equal(want[:20], one), (kind, threads)
        ext.set_isa("amx")
        for m in (1, 3, 4, 8, 13, 16, 17, 19, 20, 32, 70):
            assert mx.array_equal(qmatmul.qmatmul(x[:m], w), want[:m]), (kind, threads, m)


@needs_amx
def test_amx_large_matrix_walk(ext):
    """Over 1 MB of weights the walk goes tile by tile (each tile meets every chunk of rows): the
    same bits as VNNI there too."""
    n, k = 2304, 512
    w = weights("Q8_0", n, k, seed=9)
    x = mx.array(np.random.default_rng(3).standard_normal((40, k)).astype(np.float32))
    ext.set_num_threads(1)
    ext.set_isa("avx512_vnni")
    want = qmatmul.qmatmul(x, w)
    mx.eval(want)  # the kernel is the one set when the graph is evaluated
    ext.set_isa("amx")
    assert mx.array_equal(qmatmul.qmatmul(x, w), want)


def test_amx_switch_turns_it_off():
    code = "from mlxcel.engine.platform import qmatmul; print(qmatmul.extension().available_isas())"
    env = dict(os.environ, MLXCEL_AMX="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "amx" not in out.stdout.strip().split(",")
    assert "avx512_vnni" in out.stdout or not has_amx()


@needs_amx
def test_amx_narrow_chunks_when_asked():
    """MLXCEL_AMX_MIN_ROWS=2 sends chunks of 2 to 7 rows through the tiles too (by default they take
    the VNNI code): the same bits there, for a 32-value block type and a K-quant."""
    code = """
import mlx.core as mx, numpy as np
from gguf import GGMLQuantizationType as Q
from quant_blocks import random_blocks
from mlxcel.engine.platform import qmatmul
ext = qmatmul.extension()
qmatmul.set_threads(1)
for qtype in (Q.Q4_1, Q.Q4_K):
    n, k = 40, 512
    w = qmatmul.pack_gguf(random_blocks(qtype, n, k, seed=3), int(qtype), n, k)
    x = mx.array(np.random.default_rng(4).standard_normal((23, k)).astype(np.float32))
    for m in range(2, 24):
        ext.set_isa("avx512_vnni")
        want = qmatmul.qmatmul(x[:m], w)
        mx.eval(want)
        ext.set_isa("amx")
        assert mx.array_equal(qmatmul.qmatmul(x[:m], w), want), (qtype, m)
print("ok")
"""
    helpers = os.path.join(os.path.dirname(__file__), "..", "..", "helpers")
    env = dict(os.environ, MLXCEL_AMX_MIN_ROWS="2", PYTHONPATH=os.pathsep.join([helpers, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
