"""The CPU decode speed paths: the one-row matmul shim (``engine/platform/blas_shim.py``).

* in a process started the project's way (``scripts/with-blas``, or a server started through
  ``env_with_fast_blas``) the shim is loaded ahead of OpenBLAS;
* every form of one-row matmul MLX can send (``x @ W.T``, ``x @ W``, a transposed ``x``, ``addmm``
  with alpha/beta) is answered by the shim and equals a float64 reference, and multi-row
  matmuls are left to OpenBLAS's sgemm;
* decoding through it is still exact: greedy decoding equals the argmax of a full recompute
  (``test_decode.py``) and SmolLM2's greedy tokens equal those of a process without the shim
  (slow: two SmolLM2 processes).

And the compiled one-token rope (``engine/platform/compiled_rope.py``): bitwise ``mx.fast.rope`` at every
offset tested (scalar and per-row), and the same greedy and seeded tokens as the plain model.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.platform import blas_shim
from mlxcel.engine.platform.device import env_with_fast_blas, preload_libraries

REPO = Path(__file__).resolve().parents[3]


def loaded_libraries() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def shim_handle():
    maps = loaded_libraries()
    if "libopenblas" not in maps:
        pytest.skip("OpenBLAS is not preloaded in this process (run through scripts/with-blas)")
    path = blas_shim.shim_library()
    if path is None:
        pytest.skip("no C compiler: the shim cannot be built here")
    assert path in maps, "scripts/with-blas preloads OpenBLAS but not the shim"
    return ctypes.CDLL(path)


def sgemv_calls(lib) -> int:
    return ctypes.c_long.in_dll(lib, "mlxcel_sgemv_calls").value


def test_the_shim_comes_first_in_a_childs_preload():
    if not sys.platform.startswith("linux") or not preload_libraries():
        pytest.skip("no OpenBLAS on this machine")
    libs = preload_libraries()
    preload = env_with_fast_blas({"PATH": os.environ.get("PATH", "")})["LD_PRELOAD"].split(":")
    assert preload[: len(libs)] == libs
    if blas_shim.shim_library() is not None:
        assert "libmlxcel_sgemv" in preload[0] and "libopenblas" in preload[1]


def test_openblas_threads_default_to_the_usable_cores_unless_told_otherwise():
    from mlxcel.engine.platform.device import set_blas_threads

    if not sys.platform.startswith("linux") or not preload_libraries():
        pytest.skip("no OpenBLAS on this machine")
    cores = str(len(os.sched_getaffinity(0)))
    assert env_with_fast_blas({"PATH": ""})["OPENBLAS_NUM_THREADS"] == cores
    assert env_with_fast_blas({"PATH": "", "OPENBLAS_NUM_THREADS": "2"})["OPENBLAS_NUM_THREADS"] == "2"
    if "libopenblas" not in loaded_libraries():
        pytest.skip("OpenBLAS is not preloaded in this process")
    lib = ctypes.CDLL(preload_libraries()[-1])
    before = lib.openblas_get_num_threads()
    try:
        assert set_blas_threads(2) and lib.openblas_get_num_threads() == 2
        assert set_blas_threads(1) and lib.openblas_get_num_threads() == 1
    finally:
        set_blas_threads(before)


def test_an_avx512_cpu_runs_openblas_kernels_that_round_rows_alike():
    """``openblas_core``: on a CPU with AVX-512 F/BW/VL/DQ a child starts with OpenBLAS's SkylakeX
    kernels (replacing an inherited choice unless MLXCEL_OPENBLAS_CORETYPE says), and in this
    process (started by scripts/with-blas) a row of a float32 product has the same bits whatever
    the number of rows, from two up, which the float32 exactness tests rely on."""
    from mlxcel.engine.platform import openblas_core

    if not sys.platform.startswith("linux") or not preload_libraries():
        pytest.skip("no OpenBLAS on this machine")
    base = {"PATH": "", "OPENBLAS_CORETYPE": "Haswell"}
    assert env_with_fast_blas({**base, "MLXCEL_OPENBLAS_CORETYPE": "keep"})["OPENBLAS_CORETYPE"] == "Haswell"
    assert env_with_fast_blas({**base, "MLXCEL_OPENBLAS_CORETYPE": "Zen"})["OPENBLAS_CORETYPE"] == "Zen"
    if openblas_core.coretype({}) is None:
        pytest.skip("no AVX-512 F/BW/VL/DQ here: OpenBLAS keeps its own choice")
    assert env_with_fast_blas(base)["OPENBLAS_CORETYPE"] == "SkylakeX"
    if "libopenblas" not in loaded_libraries():
        pytest.skip("OpenBLAS is not preloaded in this process")
    lib = ctypes.CDLL(preload_libraries()[-1])
    lib.openblas_get_corename.restype = ctypes.c_char_p
    assert lib.openblas_get_corename().decode().lower() == "skylakex"
    rng = np.random.default_rng(11)
    w = mx.array(rng.standard_normal((1536, 576)).astype(np.float32))
    x = mx.array(rng.standard_normal((16, 576)).astype(np.float32))
    full = x @ w.T
    for rows in (2, 3, 5, 8):
        assert mx.array_equal((x[:rows] @ w.T)[:2], full[:2]).item(), rows


@pytest.mark.parametrize("n,k", [(7, 5), (96, 64), (1536, 576)])
def test_one_row_matmuls_go_through_sgemv_and_are_right(n, k):
    lib = shim_handle()
    rng = np.random.default_rng(n * 1000 + k)
    w = rng.standard_normal((n, k)).astype(np.float32)  # a Linear weight: out x in
    wt = np.ascontiguousarray(w.T)  # in x out
    x = rng.standard_normal((1, k)).astype(np.float32)
    c = rng.standard_normal((1, n)).astype(np.float32)
    xm, wm, wtm, cm = mx.array(x), mx.array(w), mx.array(wt), mx.array(c)
    x_col = mx.array(np.ascontiguousarray(x.T))  # k x 1: its transpose is a strided one-row operand
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    cases = {
        "x @ W.T": lambda: xm @ wm.T,
        "x @ Wt": lambda: xm @ wtm,
        "x_col.T @ W.T": lambda: x_col.T @ wm.T,
        "addmm": lambda: mx.addmm(cm, xm, wm.T, alpha=0.5, beta=2.0),
    }
    for name, f in cases.items():
        before = sgemv_calls(lib)
        out = np.array(f())
        assert sgemv_calls(lib) == before + 1, f"{name}: not answered by the shim"
        want = 0.5 * ref + 2.0 * c if name == "addmm" else ref
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k), err_msg=name)


def test_multi_row_matmuls_are_left_to_sgemm():
    lib = shim_handle()
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 64)).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    before = sgemv_calls(lib)
    out = np.array(mx.array(x) @ mx.array(w).T)
    assert sgemv_calls(lib) == before
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3)


GREEDY_SCRIPT = """
import json, sys
from mlxcel.engine.decode.plain import generate_tokens
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
lm = load_model(None)
prompt = lm.tokenizer.encode("The three laws of thermodynamics say that", add_special_tokens=False)
chain = SamplerChain(SamplerParams(temperature=0.0, ignore_eos=True), vocab_size=lm.vocab_size)
toks = [s.token for s in generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(), max_tokens=24)]
print(json.dumps({"tokens": toks, "maps_has_shim": "libmlxcel_sgemv" in open("/proc/self/maps").read()}))
"""


@pytest.mark.slow
def test_smollm2_greedy_tokens_are_the_same_with_and_without_the_shim():
    shim_handle()
    runs = {}
    for arm in ("1", "0"):
        env = env_with_fast_blas({k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXCEL_BLAS_PRELOADED")})
        if arm == "0":  # OpenBLAS alone
            env["LD_PRELOAD"] = ":".join(p for p in env["LD_PRELOAD"].split(":") if "libmlxcel_sgemv" not in p)
        out = subprocess.run([sys.executable, "-c", GREEDY_SCRIPT], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=300, check=True).stdout
        runs[arm] = json.loads(out.strip().splitlines()[-1])
    assert runs["1"]["maps_has_shim"] and not runs["0"]["maps_has_shim"]
    assert runs["1"]["tokens"] == runs["0"]["tokens"]


# --- compiled one-token rope (engine/platform/compiled_rope.py) ---------------------------------------


@pytest.mark.parametrize("heads", [9, 3, 1])
def test_compiled_rope_is_bitwise_fast_rope_at_every_offset(heads):
    import mlx.nn as nn

    from mlxcel.engine.platform.compiled_rope import DecodeStepRoPE

    for base, traditional in ((100000.0, False), (10000.0, True)):
        plain = nn.RoPE(64, traditional=traditional, base=base)
        fast = DecodeStepRoPE(plain)
        x = mx.random.normal((2, heads, 1, 64), key=mx.random.key(heads))
        for offset in [*range(0, 260), *range(1000, 9000, 37)]:
            assert mx.array_equal(fast(x, offset=offset), plain(x, offset=offset)).item(), (base, offset)
        rows = mx.array([5, 700], dtype=mx.int32)  # a batch cache's per-row offsets
        assert mx.array_equal(fast(x, offset=rows), plain(x, offset=rows)).item()
        block = mx.random.normal((1, heads, 6, 64))  # several tokens: the uncompiled path
        assert mx.array_equal(fast(block, offset=3), plain(block, offset=3)).item()


@pytest.mark.parametrize("which", ["tiny_llama_dir", "tiny_qwen_dir"])
def test_decoding_with_the_compiled_rope_gives_the_same_tokens(which, request, monkeypatch):
    import mlx.nn as nn

    from mlxcel.engine.decode.plain import generate_tokens
    from mlxcel.engine.model.loading import load_model
    from mlxcel.engine.platform.compiled_rope import DecodeStepRoPE
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams

    path = request.getfixturevalue(which)
    monkeypatch.setenv("MLXCEL_FLOAT_KERNEL", "0")  # the compiled rope is the path of MLX's float layers
    fast = load_model(path)
    plain = load_model(path)
    for _, module in plain.model.named_modules():  # the same model with nn.RoPE back in place
        for name, child in list(module.children().items()):
            if isinstance(child, DecodeStepRoPE):
                setattr(module, name, nn.RoPE(child.dims, traditional=child.traditional, base=child.base,
                                              scale=child.scale))
    kinds = lambda lm: {type(m) for _, m in lm.model.named_modules()}  # noqa: E731
    if mx.default_device().type == mx.DeviceType.cpu:
        assert DecodeStepRoPE in kinds(fast) and nn.RoPE not in kinds(fast)
    assert DecodeStepRoPE not in kinds(plain)
    prompt = [5, 17, 42, 99, 7, 123, 64, 8, 250, 31, 77]
    for params, seed in ((SamplerParams(temperature=0.0, ignore_eos=True), 0),
                         (SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True), 11)):
        streams = []
        for lm in (fast, plain):
            chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
            streams.append([s.token for s in generate_tokens(lm.model, prompt, chain, cache=lm.make_cache(),
                                                              max_tokens=40, seed=seed)])
        assert streams[0] == streams[1]


# --- pipelined batched decode (DecodeBatch.queue_step) ----------------------------------------


def test_pipelined_batch_steps_give_the_tokens_of_synchronous_ones(tiny_llama):
    from mlxcel.engine.cache.batch import DecodeBatch, forward_chunk
    from mlxcel.engine.sampling.chain import SamplerChain
    from mlxcel.engine.sampling.params import SamplerParams

    lm = tiny_llama
    prompts = {"a": [5, 17, 42, 99, 7, 123], "b": [64, 8, 250, 31, 77, 3, 9, 11]}
    n = 16
    for params, seed in ((SamplerParams(temperature=0.0, ignore_eos=True), 0),
                         (SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True), 5)):
        chain = SamplerChain(params, vocab_size=lm.vocab_size, eos_token_ids=lm.eos_token_ids)
        outs = {}
        for pipelined in (False, True):
            batch = DecodeBatch(lm.model)
            hist = {}
            first = []
            for row, prompt in prompts.items():
                cache = lm.make_cache()
                logits = forward_chunk(lm.model, prompt, cache)
                first.append(chain.select(logits[None], prompt, seed=seed, first_position=len(prompt))[0])
                hist[row] = [*prompt, first[-1]]
                batch.add(row, cache)
            if not pipelined:
                for _ in range(n):
                    logits = batch.step([hist[r][-1] for r in batch.rows])
                    for j, r in enumerate(batch.rows):
                        hist[r].append(chain.select(logits[j][None], hist[r], seed=seed,
                                                    first_position=len(hist[r]))[0])
            else:
                logits = batch.queue_step(mx.array(first, dtype=mx.int32))
                for i in range(n):
                    picks = mx.concatenate([chain.pick(logits[j][None], hist[r], seed=seed,
                                                       first_position=len(hist[r]))
                                            for j, r in enumerate(batch.rows)])
                    mx.async_eval(picks)
                    if i + 1 < n:
                        logits = batch.queue_step(picks)  # queued before step i's tokens are read
                    for r, tok in zip(batch.rows, picks.tolist()):
                        hist[r].append(tok)
            outs[pipelined] = hist
        assert outs[True] == outs[False]
    with pytest.raises(ValueError):
        DecodeBatch(lm.model).queue_step(mx.array([1, 2]))
