"""``-ctk`` / ``-ctv`` (engine/model/kv_types.py): upstream's cache types resolved or refused with their
reason, and a quantized cache served on the MLX-native profile (``MLXCEL_KERNELS=mlx``) through a
real server on a tiny checkpoint whose heads groups of 32 divide: completions, requests together
equal to each alone, prompt reuse, prompt lookup equal to plain decoding on the same cache type,
a slot saved and restored; the cache really is quantized (its keys are packed)."""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import pytest
import tiny_checkpoints
from concurrent_requests import concurrently
from mlx_lm.models.cache import QuantizedKVCache
from server_process import ServerProcess, post_ok, running

from mlxcel.engine.model.kv_types import KvQuant, KvTypeError, describe, resolve

PROMPTS = ["a b c a b c a b c a b", "the cat sat. the cat sat. the", "1 2 3 1 2 3 1 2", "x y x y x y x y x"]


@pytest.mark.parametrize("k,v,native,expected", [
    ("q8_0", "q8_0", True, KvQuant(8)), ("q4_0", "q4_0", True, KvQuant(4)), ("Q4_1", "q4_1", True, KvQuant(4)),
    ("q5_1", "q5_0", True, KvQuant(5)), ("f16", "f16", True, None), ("f16", "f16", False, None),
    ("bf16", "f16", False, None), ("f32", "f32", False, None),
])
def test_cache_types_resolve(k, v, native, expected):
    dtype = "float16" if native else "float32"
    assert resolve(k, v, compute_dtype=dtype, mlx_native=native, head_dim=64) == expected


@pytest.mark.parametrize("k,v,native,reason", [
    ("q8_0", "q8_0", False, "MLX-native profile"), ("q8_0", "f16", True, "alike"), ("q8_0", "q4_0", True, "alike"),
    ("iq4_nl", "iq4_nl", True, "non-linear"), ("q3_k", "q3_k", True, "unsupported cache type"),
    ("f32", "f32", True, "compute dtype"), ("bf16", "bf16", True, "compute dtype"),
])
def test_cache_types_refused_with_their_reason(k, v, native, reason):
    with pytest.raises(KvTypeError, match=reason):
        resolve(k, v, compute_dtype="float16" if native else "float32", mlx_native=native, head_dim=64)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("native", [True, False])
def test_not_given_the_cache_holds_the_compute_dtype(dtype, native):
    # upstream's default is f16; a start without -ctk/-ctv must run whatever the compute dtype (a
    # float32 MLX-native model refused to start when the default was f16)
    assert resolve(None, None, compute_dtype=dtype, mlx_native=native, head_dim=64) is None


@pytest.mark.parametrize("k", ["f16", "bf16", "f32"])
def test_a_float32_model_holds_every_full_type_on_both_profiles(k):
    assert resolve(k, k, compute_dtype="float32", mlx_native=True, head_dim=64) is None
    assert "asked" in describe(None, "float32", (k, k)) or k == "f32"


def test_heads_groups_do_not_divide_are_refused():
    with pytest.raises(KvTypeError, match="16 dimensions"):
        resolve("q8_0", "q8_0", compute_dtype="float16", mlx_native=True, head_dim=16)


@pytest.fixture(scope="module")
def wide_llama(checkpoints_root):
    return tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-llama-h128", "llama", seed=5, hidden=128)


@pytest.fixture(scope="module")
def servers(wide_llama, tmp_path_factory):
    native = {"MLXCEL_KERNELS": "mlx"}
    slots = tmp_path_factory.mktemp("kv-quant-slots")
    common = ("-m", str(wide_llama), "-np", "4", "-c", "2048", "-ctk", "q8_0", "-ctv", "q8_0")
    with running(q8=partial(ServerProcess, *common, "--slot-save-path", str(slots), env=native),
                 lookup=partial(ServerProcess, *common, "--spec-type", "ngram-simple", env=native)) as procs:
        yield procs


def body(i, prompt):
    fields = {"prompt": prompt, "n_predict": 24, "ignore_eos": True, "return_tokens": True, "cache_prompt": False}
    fields.update(temperature=0.8, seed=50 + i) if i % 2 else fields.update(temperature=0)
    return fields


def test_a_quantized_cache_serves_and_requests_together_equal_each_alone(servers):
    s = servers["q8"]
    assert "8-bit affine" in s.log()
    bodies = [body(i, p) for i, p in enumerate(PROMPTS)]
    alone = [post_ok(s, "/completion", b)["tokens"] for b in bodies]
    assert all(len(t) == 24 for t in alone)
    assert [r["tokens"] for r in concurrently(s.url, bodies)] == alone


def test_prompt_lookup_on_a_quantized_cache_equals_plain_decoding(servers):
    bodies = [body(i, p) for i, p in enumerate(PROMPTS)]
    plain = [post_ok(servers["q8"], "/completion", b)["tokens"] for b in bodies]
    spec = [post_ok(servers["lookup"], "/completion", b) for b in bodies]
    assert [r["tokens"] for r in spec] == plain
    assert sum(r["timings"].get("draft_n", 0) for r in spec) > 0  # it drafted, and rewound its quantized cache


def test_prompt_reuse_and_slot_files_on_a_quantized_cache(servers):
    s = servers["q8"]
    first = post_ok(s, "/completion", {"prompt": PROMPTS[0] + " a b", "n_predict": 8, "temperature": 0, "id_slot": 1})
    again = post_ok(s, "/completion", {"prompt": PROMPTS[0] + " a b", "n_predict": 8, "temperature": 0, "id_slot": 1})
    assert again["timings"]["cache_n"] > 0
    assert again["content"] == first["content"]
    saved = post_ok(s, "/slots/1?action=save", {"filename": "q8.bin"})
    assert saved["n_saved"] > 0
    post_ok(s, "/slots/1?action=erase", {})
    restored = post_ok(s, "/slots/1?action=restore", {"filename": "q8.bin"})
    assert restored["n_restored"] == saved["n_saved"]
    after = post_ok(s, "/completion", {"prompt": PROMPTS[0] + " a b", "n_predict": 8, "temperature": 0, "id_slot": 1})
    assert after["timings"]["cache_n"] > 0 and after["content"] == first["content"]


def test_the_cache_a_quantized_model_makes_is_quantized(wide_llama, monkeypatch):
    monkeypatch.setenv("MLXCEL_KERNELS", "mlx")
    from mlxcel.engine.model.loading import load_model

    lm = load_model(wide_llama)
    lm.kv_quant = KvQuant(8)
    cache = lm.make_cache()
    assert all(isinstance(c, QuantizedKVCache) and c.bits == 8 and c.group_size == 32 for c in cache)
    lm.model(mx.array([[3, 4, 5]]), cache=cache)
    assert cache[0].keys[0].dtype == mx.uint32  # packed codes
