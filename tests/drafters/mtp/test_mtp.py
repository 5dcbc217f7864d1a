"""The MTP drafter on tiny real checkpoints in each published layout.

* loading: Qwen3.5/Qwen3-Next ``mtp.*``, DeepSeek/GLM ``model.layers.{N}`` NextN layers, MiMo
  ``model.mtp_layers``, and a separate NextN assistant directory, through the real loaders;
  the head's wiring (concatenation order, zero-centred norms) checked by an "echo" head that
  must reproduce the target's own prediction;
* temperature 0: the stream equals greedy target-only decoding token for token (internal and
  assistant variants, block and chain verification);
* the head's KV cache after every round holds exactly the entries a fresh head would build from
  the emitted sequence;
* distribution: under the opt-in modified rejection sampling the emitted stream is a target
  sample (chi-square on the probability integral transform, alpha = 1e-4, dof 5), and the same
  statistic rejects argmax-against-argmax at temperature 1 (power check).
"""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
import tiny_mtp
from spec_fixtures import CHI2_CRITICAL, DIST_SAMPLES
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters import registry
from mlxcel.drafters.loading import load_target
from mlxcel.drafters.mtp.checkpoint import (
    DEEPSEEK_NEXTN,
    EMBEDDING_FIRST,
    HIDDEN_FIRST,
    MIMO,
    QWEN3_NEXT,
    load_mtp,
)
from mlxcel.drafters.mtp.drafter import MtpDrafter
from mlxcel.drafters.mtp.head import MtpHead
from mlxcel.drafters.registry import checkpoint_kind, choose
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative.acceptance import ARGMAX_AGAINST_ARGMAX, GREEDY_ARGMAX, STOCHASTIC, select_rule
from mlxcel.engine.speculative.target_features import forward_with_features, prefill_with_features
from mlxcel.engine.speculative.verify import verify_round

PROMPT_TEXT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
GREEDY = SamplerParams(temperature=0.0, ignore_eos=True, seed=0)
FULL = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True, seed=3)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mtp")


@pytest.fixture(scope="module")
def mimo_dir(root):
    return tiny_mtp.build_mimo_target(root / "mimo")


@pytest.fixture(scope="module")
def glm_echo_dir(root):
    return tiny_mtp.build_glm_target(root / "glm-echo", echo=True)


@pytest.fixture(scope="module")
def glm_dir(root):
    return tiny_mtp.build_glm_target(root / "glm")


@pytest.fixture(scope="module")
def assistant_dir(root, glm_echo_dir):
    return tiny_mtp.build_nextn_assistant(root / "glm-echo-nextn", glm_echo_dir)


@pytest.fixture(scope="module")
def moe_dir(root):
    """GLM-4.5-style: MoE layers (per-expert tensors), the MTP layer one of them."""
    return tiny_mtp.build_glm_target(root / "glm-moe", moe=True)


@pytest.fixture(scope="module")
def flat_dir(root):
    """Flatter distributions: at temperature 1 its greedy stream is far from a sample."""
    return tiny_mtp.build_glm_target(root / "glm-flat", head_scale=0.3)


@pytest.fixture(scope="module")
def mimo(mimo_dir):
    return load_model(mimo_dir)


@pytest.fixture(scope="module")
def glm_echo(glm_echo_dir):
    return load_model(glm_echo_dir)


@pytest.fixture(scope="module")
def glm(glm_dir):
    return load_model(glm_dir)


def prompt_of(model) -> list[int]:
    return list(model.tokenizer.encode(PROMPT_TEXT))


# -- loading ----------------------------------------------------------------------------------

def test_each_layout_loads_with_its_own_wiring(root, mimo_dir, glm_dir, assistant_dir, glm_echo_dir, moe_dir):
    qwen = tiny_mtp.build_qwen35_target(root / "qwen35")
    cases = [(qwen, None, QWEN3_NEXT, "internal", EMBEDDING_FIRST, True),
             (glm_dir, None, DEEPSEEK_NEXTN, "internal", EMBEDDING_FIRST, False),
             (mimo_dir, None, MIMO, "internal", HIDDEN_FIRST, True),
             (glm_echo_dir, assistant_dir, DEEPSEEK_NEXTN, "assistant", EMBEDDING_FIRST, False)]
    for target, assistant, layout, source, concat, chain_normed in cases:
        ck = load_mtp(target, assistant)
        assert (ck.layout, ck.source, ck.concat, ck.chain_normed) == (layout, source, concat, chain_normed)
        assert len(ck.modules) == 1 and len(ck.modules[0].blocks) == 1
        assert ck.modules[0].proj.shape == (tiny_mtp.HIDDEN, 2 * tiny_mtp.HIDDEN)
    # Tensors arrive unchanged, except the zero-centred norms of the Qwen3-Next family (+1).
    raw = mx.load(str(glm_dir / "model.safetensors"))
    ck = load_mtp(glm_dir)
    assert mx.array_equal(ck.modules[0].proj, raw["model.layers.2.eh_proj.weight"]).item()
    assert mx.array_equal(ck.modules[0].blocks[0]["self_attn.q_proj.weight"],
                          raw["model.layers.2.self_attn.q_proj.weight"]).item()
    assert "shared_head.head.weight" not in ck.modules[0].blocks[0]  # the target's head is used
    # An MoE MTP layer: per-expert tensors stacked in expert order.
    raw = mx.load(str(moe_dir / "model.safetensors"))
    block = load_mtp(moe_dir).modules[0].blocks[0]
    stacked = block["mlp.switch_mlp.up_proj.weight"]
    assert stacked.shape[0] == 4 and not any(".experts." in k for k in block)
    for e in range(4):
        assert mx.array_equal(stacked[e], raw[f"model.layers.2.mlp.experts.{e}.up_proj.weight"]).item()
    raw = mx.load(str(qwen / "model.safetensors"))
    ck = load_mtp(qwen)
    assert mx.array_equal(ck.modules[0].final_norm, raw["mtp.norm.weight"] + 1.0).item()
    assert mx.array_equal(ck.modules[0].blocks[0]["input_layernorm.weight"],
                          raw["mtp.layers.0.input_layernorm.weight"] + 1.0).item()


@pytest.mark.parametrize("layout", ["mimo", "glm", "glm-moe", "qwen35", "assistant"])
def test_an_echo_head_predicts_what_the_target_predicted(root, layout):
    """An echo module passes the target hidden straight to the shared head, so its argmax at each
    entry is the target's own argmax at the previous position. Swapping the concatenation order
    or forgetting the zero-centred norms breaks this."""
    if layout == "assistant":
        target_dir = tiny_mtp.build_glm_target(root / "echo-glm-b", echo=True)
        assistant = tiny_mtp.build_nextn_assistant(root / "echo-glm-b-nextn", target_dir)
    else:
        build = {"mimo": tiny_mtp.build_mimo_target, "glm": tiny_mtp.build_glm_target,
                 "glm-moe": lambda out, echo: tiny_mtp.build_glm_target(out, echo=echo, moe=True),
                 "qwen35": tiny_mtp.build_qwen35_target}[layout]
        target_dir, assistant = build(root / f"echo-{layout}", echo=True), None
    target = load_model(target_dir)
    head = MtpHead(load_mtp(target_dir, assistant), target.model)
    tokens = prompt_of(target)[:12]
    features = forward_with_features(target.model, tokens, target.make_cache())
    logits, _ = head.step(tokens[1:], features.normed[:-1], head.make_cache())
    assert logits.argmax(axis=-1).tolist() == features.logits[:-1].argmax(axis=-1).tolist()


def test_a_quantized_target_binds_float_mtp_weights(root):
    """A 4-bit target (as Metal/CUDA keep it): the copied layer is dequantized for the float MTP
    weights, and the echo head still reproduces the target's own prediction."""
    import mlx.nn as nn

    target_dir = tiny_mtp.build_glm_target(root / "echo-glm-q", echo=True)
    target = load_model(target_dir)
    nn.quantize(target.model, group_size=32, bits=4)
    head = MtpHead(load_mtp(target_dir), target.model)
    tokens = prompt_of(target)[:12]
    features = forward_with_features(target.model, tokens, target.make_cache())
    logits, _ = head.step(tokens[1:], features.normed[:-1], head.make_cache())
    assert logits.argmax(axis=-1).tolist() == features.logits[:-1].argmax(axis=-1).tolist()


def test_loading_refusals_are_clear(root, tiny_llama_dir, glm_dir):
    with pytest.raises(ModelLoadError, match="has no MTP layers"):
        load_mtp(tiny_llama_dir)
    with pytest.raises(ModelLoadError, match="not an MTP assistant"):
        load_mtp(glm_dir, tiny_llama_dir)
    broken = root / "glm-broken"
    shutil.copytree(glm_dir, broken)
    weights = mx.load(str(broken / "model.safetensors"))
    # Expert tensors with a gap in their numbering are named.
    weights["model.layers.2.mlp.experts.0.up_proj.weight"] = mx.zeros((4, 4))
    weights["model.layers.2.mlp.experts.2.up_proj.weight"] = mx.zeros((4, 4))
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match=r"experts \[1\]"):
        load_mtp(broken)
    # An MoE MTP layer on a dense target does not fit the target's layer: refused at bind.
    del weights["model.layers.2.mlp.experts.2.up_proj.weight"]
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match="does not fit the target's DecoderLayer"):
        MtpHead(load_mtp(broken), load_model(glm_dir).model)
    # A missing fusion tensor is named.
    del weights["model.layers.2.hnorm.weight"]
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match="hnorm"):
        load_mtp(broken)


def test_bind_releases_the_file_tensors_and_a_second_target_rereads_them(mimo_dir, glm_echo_dir, assistant_dir,
                                                                        glm_echo):
    drafter = MtpDrafter.load(glm_echo_dir, assistant_dir)
    drafter.bind(glm_echo.model)
    assert drafter.checkpoint.modules == [] and drafter.head.source == "assistant"
    other = load_model(glm_echo_dir)
    drafter.bind(other.model)  # rebinding reads the assistant again
    assert drafter.head.embed_tokens is other.model.model.embed_tokens and drafter.head.source == "assistant"


@pytest.mark.parametrize("probe", ["pass", "fail"])
def test_qwen35_mtp_layers_speculate_on_the_hybrid_cache(root, monkeypatch, probe):
    """Qwen3.5's own MTP layers on its gated-delta + attention cache: block rounds cut the recurrent
    layers back with the verify round's state tape, chain rounds never forward past the emitted
    tokens; both are greedy target decoding token for token, with drafts accepted."""
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", probe)
    qwen = tiny_mtp.build_qwen35_target(root / "qwen35-echo", echo=True)
    target = load_model(qwen)
    prompt = prompt_of(target)
    want = target_only_tokens(target, prompt, GREEDY, 40)
    got, counters = speculative_tokens(target, MtpDrafter.load(qwen), prompt, GREEDY, 40, k=3)
    assert got == want
    assert counters.rounds > 0 and counters.accepted > 0
    assert counters.chain_rounds == (counters.rounds if probe == "fail" else 0)


def test_the_kind_is_detected_from_config(glm_dir, assistant_dir):
    # A NextN assistant is a drafter-only checkpoint by structure: never loaded as a model.
    assert checkpoint_kind(json.loads((assistant_dir / "config.json").read_text())) is registry.MTP
    assert checkpoint_kind(json.loads((glm_dir / "config.json").read_text())) is None  # a target with MTP layers
    assert choose(draft_model=str(assistant_dir)).kind is registry.MTP
    assert choose(spec_types=["draft-mtp"]).kind is registry.INTERNAL_MTP
    with pytest.raises(ModelLoadError, match="mtp drafter checkpoint, not a standalone model"):
        load_target(assistant_dir)


# -- temperature 0 ---------------------------------------------------------------------------

@pytest.mark.parametrize("probe", ["pass", "fail"])
@pytest.mark.parametrize("variant", ["mimo", "glm-echo", "assistant", "glm-moe"])
def test_temperature_zero_is_greedy_target_decoding(monkeypatch, probe, variant, mimo, mimo_dir, glm_echo,
                                                    glm_echo_dir, assistant_dir, moe_dir):
    """Block verification (probe verdict ``pass``) and chain verification (``fail``)."""
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", probe)
    target, drafter = {
        "mimo": (mimo, lambda: MtpDrafter.load(mimo_dir)),
        "glm-echo": (glm_echo, lambda: MtpDrafter.load(glm_echo_dir)),
        "assistant": (glm_echo, lambda: MtpDrafter.load(glm_echo_dir, assistant_dir)),
        "glm-moe": (load_model(moe_dir), lambda: MtpDrafter.load(moe_dir)),
    }[variant]
    prompt = prompt_of(target)
    want = target_only_tokens(target, prompt, GREEDY, 40)
    got, counters = speculative_tokens(target, drafter(), prompt, GREEDY, 40)
    assert counters.rule == GREEDY_ARGMAX
    assert got == want
    assert counters.rounds > 0
    if variant in ("glm-echo", "assistant"):
        assert counters.accepted > 0  # accepted drafts really ran through the bookkeeping


# -- the head's cache -------------------------------------------------------------------------

def test_a_retracted_proposal_changes_nothing(monkeypatch, glm_echo, glm_echo_dir):
    """Proposing twice for the same sequence (the first block never verified) gives the same
    block, and the run still equals greedy target decoding."""
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", "pass")
    target = glm_echo
    drafter = MtpDrafter.load(glm_echo_dir)
    prompt = prompt_of(target)
    chain = SamplerChain(GREEDY, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids)
    cache = target.make_cache()
    drafter.bind(target.model)
    features = prefill_with_features(target.model, prompt, cache)
    sequence = [*prompt, chain.select(features.logits, prompt, (), 0, len(prompt))[0]]
    drafter.start(sequence, GREEDY, 0)
    drafter.observe_target(features)
    for _ in range(6):
        first = drafter.propose(sequence, 3).tokens
        assert drafter.propose(sequence, 3).tokens == first  # retracted, asked again
        r = verify_round(target.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=3, seed=0)
        sequence.extend(r.emitted)
        assert drafter.context_length == cache_length(cache)
    assert sequence[len(prompt):] == target_only_tokens(target, prompt, GREEDY, len(sequence) - len(prompt))


def fresh_head_cache(target, drafter, sequence):
    """The head cache a fresh drafter builds from a target-only prefill of ``sequence[:-1]``."""
    features = prefill_with_features(target.model, sequence[:-1], target.make_cache())
    cache = drafter.head.make_cache()
    drafter.head.step(sequence[1:], features.normed, cache)
    return cache


@pytest.mark.parametrize("variant", ["glm-random", "glm-echo"])
def test_head_cache_tracks_the_emitted_sequence(monkeypatch, variant, glm, glm_dir, glm_echo, glm_echo_dir):
    """After every round: entries + owed rows == target cache length, no provisional entry
    survives, and the cached keys/values equal a fresh head's (one forward over the emitted
    sequence)."""
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", "pass")
    target, path = (glm, glm_dir) if variant == "glm-random" else (glm_echo, glm_echo_dir)
    # glm-random also feeds the prompt's entries in chunks of 5
    drafter = MtpDrafter.load(path, prefill_step=5 if variant == "glm-random" else 512)
    params = FULL if variant == "glm-random" else GREEDY
    prompt = prompt_of(target)
    chain = SamplerChain(params, vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids)
    cache = target.make_cache()
    drafter.bind(target.model)
    features = prefill_with_features(target.model, prompt, cache)
    sequence = [*prompt, chain.select(features.logits, prompt, (), params.seed, len(prompt))[0]]
    drafter.start(sequence, params, params.seed)
    drafter.observe_target(features)
    rule = select_rule(params, has_proposal_distribution=True, argmax_verify=True, stochastic=True)
    accepted = []
    for _ in range(8):
        r = verify_round(target.model, cache, chain, drafter, sequence, rule=rule, k=3, seed=params.seed)
        sequence.extend(r.emitted)
        accepted.append(r.accepted)
        assert drafter.context_length == cache_length(cache) == len(sequence) - 1
        assert drafter.provisional == 0
        assert cache_length(drafter.cache) == drafter.entries
    # Feed what is owed, then compare with a fresh build over the same sequence.
    drafter.propose(sequence, 1)
    drafter.observe(sequence, None, 0)
    fresh = fresh_head_cache(target, drafter, sequence)
    assert cache_length(drafter.cache) == cache_length(fresh) == len(sequence) - 1
    n = len(sequence) - 1
    for ours, theirs in zip(drafter.cache, fresh):  # rows past the offset are dead storage
        for a, b in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
            np.testing.assert_allclose(np.array(a[..., :n, :]), np.array(b[..., :n, :]), rtol=0, atol=2e-5)
    if variant == "glm-echo":
        assert max(accepted) == 3  # a fully accepted round ran
    else:
        assert min(accepted) == 0  # a fully rejected round ran


# -- distribution ---------------------------------------------------------------------------

def pit_statistic(target, tokens_by_run, prompt, seed: int = 0) -> float:
    """Chi-square of the randomised probability integral transform over 6 equal bins.

    For each emitted token x at position t, with the target's p_t (the full softmax at
    temperature 1) and tokens ordered by decreasing p_t: u = P(tokens before x) + V p_t(x), V ~
    U[0, 1). A stream sampled from the target gives i.i.d. U[0, 1) values whatever p_t is, so the
    statistic follows chi-square(5); a greedy stream piles u near 0."""
    rng = np.random.default_rng(seed)
    us = []
    for tokens in tokens_by_run:
        sequence = prompt + tokens
        logits = target.model(mx.array([sequence[:-1]]), cache=target.make_cache())[0, len(prompt) - 1:]
        p = np.array(mx.softmax(logits.astype(mx.float32), axis=-1))
        for row, x in zip(p, tokens):
            order = np.argsort(-row, kind="stable")
            rank = int(np.nonzero(order == x)[0][0])
            us.append(row[order[:rank]].sum() + rng.random() * row[x])
    counts = np.bincount(np.minimum((np.array(us) * 6).astype(int), 5), minlength=6).astype(float)
    expected = counts.sum() / 6
    return float(((counts - expected) ** 2 / expected).sum())


def mtp_stream(target, path, n: int, *, stochastic: bool, run_len: int = 300):
    prompt = prompt_of(target)
    runs = []
    counters_rule = None
    for i in range(max(1, -(-n // run_len))):
        params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True, seed=100 + i)
        tokens, counters = speculative_tokens(target, MtpDrafter.load(path), prompt, params, min(run_len, n - i * run_len),
                                       k=3, stochastic=stochastic)
        runs.append(tokens)
        counters_rule = counters.rule
    return prompt, runs, counters_rule


def check_distribution(monkeypatch, target, path, n):
    monkeypatch.setenv("MLXCEL_EXACTNESS_PROBE", "pass")
    prompt, runs, rule = mtp_stream(target, path, n, stochastic=True)
    assert rule == STOCHASTIC
    stat = pit_statistic(target, runs, prompt)
    assert stat <= CHI2_CRITICAL, f"stochastic MTP stream: chi-square {stat:.2f} > {CHI2_CRITICAL} over {n} tokens"
    prompt, runs, rule = mtp_stream(target, path, n, stochastic=False)
    assert rule == ARGMAX_AGAINST_ARGMAX
    stat = pit_statistic(target, runs, prompt)
    assert stat > CHI2_CRITICAL, f"argmax-against-argmax not rejected at temperature 1: {stat:.2f}"


def test_rejection_sampling_on_the_mtp_path_is_a_target_sample(monkeypatch, flat_dir):
    check_distribution(monkeypatch, load_model(flat_dir), flat_dir, 600)


@pytest.mark.slow
def test_rejection_sampling_on_the_mtp_path_is_a_target_sample_long(monkeypatch, flat_dir):
    check_distribution(monkeypatch, load_model(flat_dir), flat_dir, DIST_SAMPLES)
