"""LoRA adapters on tiny real checkpoints (engine.model.lora): both layouts give the merged model
(against merges computed here, and against mlx-lm's own LoRA layers), rows with different adapter
mixes share one forward bit for bit, adapted blocks leave the planned kernels, and a bad adapter is
refused at load with the model left as it was."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import numpy as np
import pytest
import tiny_gguf
import tiny_lora
from gguf import GGMLQuantizationType as Q
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load as mlx_lm_load

from mlxcel.engine.cache.batch import DecodeBatch
from mlxcel.engine.cache.ragged import RaggedBatch, StepPlan
from mlxcel.engine.decode.step import BatchCacheRows, OwnCaches, RaggedRows, Row, run_step
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.model.lora import attach_adapters
from mlxcel.engine.model.lora_linear import LoraLayer, active_scales, uniform_scales
from mlxcel.engine.model.lora_set import AdapterInfo, AdapterSet
from mlxcel.engine.platform.lean_blocks import LeanBlock

RANK_A, ALPHA_A, MLX_SCALE = 4, 8.0, 2.0
TOKENS = mx.array([[5, 9, 30, 44, 7, 100, 3, 61]])


@pytest.fixture(scope="module")
def config(tiny_llama_dir):
    return json.loads((tiny_llama_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def factors(config):
    """Adapter 0 on every linear of every layer; adapter 1 on the attention of layer 1 and the head."""
    return (tiny_lora.random_factors(config, tiny_lora.EVERY_LINEAR, rank=RANK_A, seed=5),
            {**tiny_lora.random_factors(config, tiny_lora.ATTENTION, rank=2, seed=6, layers=[1]),
             **tiny_lora.head_factors(config, seed=7)})


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, checkpoints_root, factors):
    root = checkpoints_root / "lora"
    root.mkdir(exist_ok=True)
    gguf = tiny_lora.write_gguf_adapter(tiny_llama_dir, root / "a.gguf", factors[0], alpha=ALPHA_A, dtype=Q.F16,
                                        metadata={"adapter.lora.task_name": "tiny-task"})
    mlx = tiny_lora.write_mlx_adapter(root / "b", factors[1], scale=MLX_SCALE)
    return str(gguf), str(mlx)


@pytest.fixture(scope="module")
def q8_path(tiny_llama_dir, checkpoints_root):
    return tiny_gguf.write_gguf(tiny_llama_dir, checkpoints_root / "lora-q8.gguf", tiny_gguf.uniform(Q.Q8_0))


@pytest.fixture(scope="module")
def adapted_q8(q8_path, adapters):
    """The Q8_0 GGUF on the packed CPU kernels (each row's bits independent of the batch), with both."""
    lm = load_model(q8_path)
    attach_adapters(lm, [(adapters[0], 1.0), (adapters[1], 0.5)])
    return lm


def logits(lm, scales, tokens=TOKENS):
    with active_scales(uniform_scales(scales)):
        return lm.model(tokens, cache=lm.make_cache())


def f16(factors):
    return {k: (a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32))
            for k, (a, b) in factors.items()}


def test_both_layouts_give_the_merged_model(tiny_llama_dir, adapters, factors):
    # the float checkpoint (float32 tiles): each scale mix is the checkpoint with W + s * f * B @ A merged
    # in, f being alpha / rank for the GGUF adapter (its q/k B rows put back in Hugging Face order) and
    # mlx-lm's scale for the directory
    lm = load_model(tiny_llama_dir)
    attach_adapters(lm, [(adapters[0], 1.0), (adapters[1], 1.0)])
    reference, _ = mlx_lm_load(str(tiny_llama_dir))
    base = logits(lm, (0.0, 0.0))
    for scales in ((1.0, 0.0), (0.5, 0.0), (0.0, 1.0), (0.7, -0.3)):
        merged = tiny_lora.merged_weights(tiny_llama_dir, [(f16(factors[0]), scales[0] * ALPHA_A / RANK_A),
                                                           (factors[1], scales[1] * MLX_SCALE)])
        reference.load_weights(list(merged.items()))
        ours = logits(lm, scales)
        assert mx.allclose(ours, reference(TOKENS), atol=2e-4).item(), scales
        assert not mx.allclose(ours, base, atol=1e-2).item(), scales  # the adapter does change the output


def test_the_directory_layout_is_mlx_lm_own(tiny_llama_dir, adapters):
    # mlx-lm's own loader and LoRALinear layers on the same directory: the same logits, at its scale
    # and at half of it (mlx-lm's scale times the adapter's runtime scale)
    lm = load_model(tiny_llama_dir)
    attach_adapters(lm, [(adapters[1], 1.0)])
    theirs, _ = mlx_lm_load(str(tiny_llama_dir))
    load_adapters(theirs, adapters[1])
    assert any(isinstance(m, LoRALinear) for _, m in theirs.named_modules())
    assert mx.allclose(logits(lm, (1.0,)), theirs(TOKENS), atol=2e-4).item()
    for _, m in theirs.named_modules():
        if isinstance(m, LoRALinear):
            m.scale = MLX_SCALE * 0.5
    assert mx.allclose(logits(lm, (0.5,)), theirs(TOKENS), atol=2e-4).item()


def test_blocks_with_adapted_layers_leave_the_planned_kernels(adapted_q8, q8_path):
    # layer 0 and 1 have adapted layers (adapter 0 is on every layer): no plan, so the ragged forward
    # and the own-cache forward run the modules; the plain model keeps its plans
    plain = load_model(q8_path)
    assert all(isinstance(b, LeanBlock) and b._plan is not None for b in plain.model.model.layers)
    for block in adapted_q8.model.model.layers:
        assert block._plan is None
        assert isinstance(block.self_attn.q_proj, LoraLayer) and isinstance(block.mlp.down_proj, LoraLayer)
    assert isinstance(adapted_q8.model.lm_head, LoraLayer)


def test_an_unadapted_block_keeps_its_plan(q8_path, tiny_llama_dir, checkpoints_root, config):
    only_layer1 = tiny_lora.random_factors(config, tiny_lora.ATTENTION, rank=2, seed=9, layers=[1])
    path = tiny_lora.write_gguf_adapter(tiny_llama_dir, checkpoints_root / "lora" / "layer1.gguf", only_layer1)
    lm = load_model(q8_path)
    attach_adapters(lm, [(str(path), 1.0)])
    first, second = lm.model.model.layers
    assert first._plan is not None and second._plan is None


def ragged_rows(lm, prompts, scales):
    batch = RaggedBatch(lm.model)
    rows = []
    for key, (prompt, s) in enumerate(zip(prompts, scales)):
        batch.add(key, lm.make_cache())
        rows.append(Row(key, prompt, logits=len(prompt), adapters=s))
    return batch, rows


PROMPTS = [[5, 9, 30, 44], [7, 100, 3], [61, 2, 8, 8, 19], [40, 41], [11, 12, 13]]
MIXES = [(1.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.5, 0.5), (-0.25, 2.0)]


def test_rows_with_different_adapter_mixes_share_one_forward_bit_for_bit(adapted_q8):
    # every row's logits, beside rows at other scales, are the bits it gets alone; two steps (prompts,
    # then one token each) so cached keys written under the adapters are attended to
    lm = adapted_q8
    together, rows = ragged_rows(lm, PROMPTS, MIXES)
    first = run_step(RaggedRows(together), rows)
    second = run_step(RaggedRows(together), [Row(k, [3 + k], logits=1, adapters=m) for k, m in enumerate(MIXES)])
    for i, (prompt, s) in enumerate(zip(PROMPTS, MIXES)):
        alone, (row,) = ragged_rows(lm, [prompt], [s])
        (one,) = run_step(RaggedRows(alone), [row])
        (two,) = run_step(RaggedRows(alone), [Row(0, [3 + i], logits=1, adapters=s)])
        assert mx.array_equal(one.logits, first[i].logits).item(), s
        assert mx.array_equal(two.logits, second[i].logits).item(), s


def test_a_ragged_row_equals_its_own_cache_forward(adapted_q8):
    # the ragged forward (flat tokens, per-token scales, the head at the picked positions) against the
    # sequence on its own cache (uniform scales): the same bits, so the adapter is applied in both
    lm = adapted_q8
    for prompt, s in zip(PROMPTS, MIXES):
        batch, (row,) = ragged_rows(lm, [prompt], [s])
        (ragged,) = run_step(RaggedRows(batch), [row])
        (own,) = run_step(OwnCaches(lm.model, {0: lm.make_cache()}), [Row(0, prompt, logits=1, adapters=s)])
        assert mx.array_equal(ragged.logits[-1:], own.logits).item(), s


def test_scale_zero_is_the_base_model_bitwise(adapted_q8, q8_path):
    plain = load_model(q8_path)
    want = logits(plain, ())
    assert mx.array_equal(logits(adapted_q8, (0.0, 0.0)), want).item()
    # beside adapted rows too: base + 0 is the base value
    together, rows = ragged_rows(adapted_q8, [TOKENS[0].tolist(), [1, 2, 3]], [(0.0, 0.0), (1.0, 1.0)])
    out = run_step(RaggedRows(together), rows)
    assert mx.array_equal(out[0].logits, want[0]).item()


def test_a_pipelined_step_runs_each_row_at_its_scales(adapted_q8):
    # RaggedBatch.step (lazy tokens, the scheduler's pipelined steps) keeps each row's scales from the
    # forward before it: the same bits as a planned forward with the scales given
    lm = adapted_q8
    prompts, mixes = PROMPTS[:3], MIXES[:3]
    planned, rows = ragged_rows(lm, prompts, mixes)
    lazy, rows2 = ragged_rows(lm, prompts, mixes)
    run_step(RaggedRows(planned), rows)
    run_step(RaggedRows(lazy), rows2)
    want = run_step(RaggedRows(planned), [Row(k, [20 + k], logits=1, adapters=m) for k, m in enumerate(mixes)])
    got = lazy.step(mx.array([20, 21, 22], dtype=mx.int32))
    for k in range(3):
        assert mx.array_equal(want[k].logits[0], got[k]).item(), k


def test_adapter_set_scales():
    s = AdapterSet([AdapterInfo("a.gguf", "t", "p"), AdapterInfo("b")], (1.0, 0.5))
    assert s.for_request(None) == (1.0, 0.5) and s.for_request({}) == (1.0, 0.5)
    assert s.for_request({1: 2.0}) == (0.0, 2.0)  # listed adapters at theirs, the others at 0
    s.set_scales({0: 0.25})
    assert s.scales == (0.25, 0.0)
    assert s.describe() == [{"id": 0, "path": "a.gguf", "scale": 0.25, "task_name": "t", "prompt_prefix": "p"},
                            {"id": 1, "path": "b", "scale": 0.0, "task_name": "", "prompt_prefix": ""}]


def test_gguf_metadata_is_described(adapted_q8, adapters):
    described = adapted_q8.adapters.describe()
    assert [(d["path"], d["scale"], d["task_name"]) for d in described] == [
        (adapters[0], 1.0, "tiny-task"), (adapters[1], 0.5, "")]


def _refused(lm, path, needle):
    before = [type(m) for _, m in lm.model.named_modules()]
    with pytest.raises(ModelLoadError, match=needle):
        attach_adapters(lm, [(str(path), 1.0)])
    assert [type(m) for _, m in lm.model.named_modules()] == before and lm.adapters is None


def test_bad_adapters_are_refused_and_leave_the_model_alone(q8_path, tiny_llama_dir, checkpoints_root, config):
    lm = load_model(q8_path)
    root = checkpoints_root / "lora-bad"
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    wide = {**config, "hidden_size": 128}  # another model's shapes
    factors = tiny_lora.random_factors(wide, tiny_lora.ATTENTION, rank=2, seed=1)
    _refused(lm, tiny_lora.write_gguf_adapter(tiny_llama_dir, root / "wide.gguf", factors), "incorrect shape")
    _refused(lm, tiny_lora.write_mlx_adapter(root / "wide", factors), "incorrect shape")
    ok = tiny_lora.random_factors(config, tiny_lora.ATTENTION, rank=2, seed=1)
    _refused(lm, tiny_lora.write_gguf_adapter(tiny_llama_dir, root / "qwen.gguf", ok, arch="qwen2"),
             "arch mismatch")
    beyond = {k.replace("layers.1.", "layers.7."): v for k, v in ok.items()}
    cfg8 = root / "cfg8"
    cfg8.mkdir(exist_ok=True)
    (cfg8 / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 8}))
    _refused(lm, tiny_lora.write_gguf_adapter(cfg8, root / "beyond.gguf", beyond), "does not exist in base model")
    _refused(lm, tiny_lora.write_mlx_adapter(root / "beyond", beyond), "does not exist in base model")
    embd = {"model.embed_tokens.lora_a": mx.array(rng.standard_normal((384, 2)).astype(np.float32)),
            "model.embed_tokens.lora_b": mx.array(rng.standard_normal((2, 64)).astype(np.float32))}
    _refused(lm, tiny_lora.write_mlx_adapter(root / "embd", ok, extra=embd), "linear layers only")
    _refused(lm, tiny_lora.write_mlx_adapter(root / "dora", ok, fine_tune_type="dora"), "only LoRA adapters")
    _refused(lm, _half_adapter(root / "half", ok), "missing one component")
    _refused(lm, q8_path, "not a LoRA adapter")  # a model GGUF given as an adapter
    _refused(lm, root / "nowhere.gguf", "not found")


def _half_adapter(out, factors):
    tiny_lora.write_mlx_adapter(out, factors)
    weights = mx.load(str(out / "adapters.safetensors"))
    weights.pop("model.layers.0.self_attn.q_proj.lora_b")
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    return out


def test_own_cache_rows_and_verify_rounds_take_the_scales(adapted_q8):
    # a sequence's forward on its own cache with its scales is the adapted model; without a row's scales
    # (outside any forward that sets them) the layers are their base
    lm = adapted_q8
    a = logits(lm, (1.0, 0.0))
    b = lm.model(TOKENS, cache=lm.make_cache())
    assert not mx.allclose(a, b, atol=1e-2).item()
    assert mx.array_equal(b, logits(lm, (0.0, 0.0))).item()


def test_random_mixes_in_one_forward(adapted_q8):
    # a wider batch of random prompts and random scale mixes: every row its own bits
    lm = adapted_q8
    rnd = random.Random(3)
    prompts = [[rnd.randrange(300) for _ in range(rnd.randrange(1, 7))] for _ in range(7)]
    mixes = [(rnd.choice([0.0, 0.5, 1.0]), rnd.choice([0.0, 1.0, 3.0])) for _ in prompts]
    together, rows = ragged_rows(lm, prompts, mixes)
    out = run_step(RaggedRows(together), rows)
    for i, (prompt, s) in enumerate(zip(prompts, mixes)):
        alone, (row,) = ragged_rows(lm, [prompt], [s])
        (one,) = run_step(RaggedRows(alone), [row])
        assert mx.array_equal(one.logits, out[i].logits).item(), (i, s)


def test_plans_name_their_rows_scales():
    plan = StepPlan()
    plan.add(0, [1, 2], 0, adapters=(0.5, 1))
    plan.add(1, [3], 0)
    assert plan.adapters == [(0.5, 1.0), ()]


def test_batch_cache_rows_each_run_at_their_scales(adapted_q8):
    # mlx-lm's batch cache (rows that cannot join the ragged batch): one token a row, per-row scales
    # [B, 1, A]; each row's logits are the ones it gets on its own cache
    lm = adapted_q8
    prompts, mixes = [[5, 9, 30], [7, 100, 3], [61, 2, 8]], MIXES[:3]
    batch, alone = DecodeBatch(lm.model), []
    for key, (prompt, s) in enumerate(zip(prompts, mixes)):
        cache = lm.make_cache()
        run_step(OwnCaches(lm.model, {key: cache}), [Row(key, prompt, adapters=s)])
        own = lm.make_cache()
        run_step(OwnCaches(lm.model, {key: own}), [Row(key, prompt, adapters=s)])
        (out,) = run_step(OwnCaches(lm.model, {key: own}), [Row(key, [40 + key], logits=1, adapters=s)])
        alone.append(out.logits)
        batch.add(key, cache)
    outs = run_step(BatchCacheRows(batch), [Row(k, [40 + k], logits=1, adapters=m) for k, m in enumerate(mixes)])
    for k in range(3):
        assert mx.allclose(outs[k].logits, alone[k], atol=1e-4).item(), k
