"""DFlash-family drafters (DFlash, LFM2 DSpark, Muse Glimmer assistant) on real tiny checkpoints.

* each published on-disk format (tests/helpers/tiny_drafters.py) is read by the real loader, and a bad
  one is refused clearly;
* temperature 0 equals greedy target-only decoding token for token on each path, with the block
  scored in one forward and (probe failed) token by token, with the real drafters and with a
  scripted one whose drafts are partly the target's own tokens (mixed acceptance); every round
  checks that the drafter holds the features of exactly the tokens the target cache holds;
* the round loop's rules: argmax-against-argmax by default above temperature 0, the stochastic
  opt-in when asked;
* DSpark declines a sampling request (plain decoding, one warning);
* Muse Glimmer: starts at four rows, widens when the window saturates, probes both widths.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest
import tiny_drafters
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters.dflash.checkpoint import load_dflash_checkpoint
from mlxcel.drafters.dflash.drafter import DFlashDrafter
from mlxcel.drafters.dflash.dspark import DSparkDrafter
from mlxcel.drafters.dflash.muse_glimmer import DECLARED_DEPTH, MuseGlimmerDrafter
from mlxcel.drafters.loading import load_model_drafter
from mlxcel.engine.cache.kv_cache import cache_length
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.chain import SamplerChain
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import exactness_probe, switches
from mlxcel.engine.speculative.acceptance import ARGMAX_AGAINST_ARGMAX, GREEDY_ARGMAX, STOCHASTIC
from mlxcel.engine.speculative.target_features import prefill_with_features
from mlxcel.engine.speculative.verify import verify_round

GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)
PROMPT = "The quick brown fox jumps over the lazy dog. The quick"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("dflash")


@pytest.fixture(scope="module")
def qwen3(root):
    return load_model(tiny_drafters.build_target(root / "qwen3", "qwen3", seed=3))


@pytest.fixture(scope="module")
def muse(root):
    return load_model(tiny_drafters.build_target(root / "muse", "muse_glimmer", seed=5, window=16))


@pytest.fixture(scope="module")
def drafter_dirs(root, qwen3, muse):
    return {
        "dflash": tiny_drafters.build_dflash(root / "dflash-b8", qwen3.path, layer_ids=(1, 3)),
        "dspark": tiny_drafters.build_dspark(root / "dspark-b5", qwen3.path, layer_ids=(0, 2)),
        "muse-glimmer": tiny_drafters.build_muse_assistant(root / "muse-asst", muse.path, layer_ids=(1, 2),
                                                           window=16),
    }


def target_for(kind, qwen3, muse):
    return muse if kind == "muse-glimmer" else qwen3


def plain(lm, prompt, n, params=GREEDY):
    return target_only_tokens(lm, prompt, params, n)


def speculate(lm, drafter, prompt, n, params=GREEDY, k=4, **kw):
    return speculative_tokens(lm, drafter, prompt, params, n, k, **kw)


def before_the_first_round(lm, drafter, prompt):
    """What the round loop does before its first round, by hand: bind the drafter, prefill the target
    with features, pick the first token greedily and hand the drafter its context. Returns the
    target cache, the greedy chain and the sequence for ``verify_round``."""
    drafter.bind(lm.model)
    cache = lm.make_cache()
    features = prefill_with_features(lm.model, prompt, cache, drafter.feature_layers)
    chain = SamplerChain(GREEDY, vocab_size=lm.vocab_size)
    sequence = prompt + [chain.select(features.logits, prompt)[0]]
    drafter.start(sequence, GREEDY, 0)
    drafter.observe_target(features)
    return cache, chain, sequence


def scripted(cls, reference: list[int], wrong_every: int = 0, wrong=None):
    """The real drafter class, but its drafts are the target's own greedy tokens (from ``reference``,
    indexed by absolute position) except at every ``wrong_every``-th position (or where ``wrong(position)``):
    the network, its context bookkeeping and the round loop all run, with a known mix of accepts and
    rejects."""
    wrong = wrong or (lambda position: position % wrong_every == 0)

    class Scripted(cls):
        def _draw(self, row, history, position):
            super()._draw(row, history, position)
            if position >= len(reference):
                return 0, None
            token = reference[position]
            return ((token + 1) % 50 if wrong(position) else token), None

    return Scripted


# -- loading --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,cls,family", [("dflash", DFlashDrafter, "dflash"), ("dspark", DSparkDrafter, "dspark"),
                                             ("muse-glimmer", MuseGlimmerDrafter, "muse-glimmer")])
def test_each_published_format_loads_by_structure(drafter_dirs, kind, cls, family):
    drafter = load_model_drafter(drafter_dirs[kind], target_vocab_size=384)
    assert type(drafter) is cls
    assert drafter.spec.family == family
    network, spec = load_dflash_checkpoint(drafter_dirs[kind])
    assert not hasattr(network, "embed_tokens") and not hasattr(network, "lm_head")
    if kind == "dspark":
        assert spec.max_proposals == spec.block_size == 5 and spec.markov_rank == 8 and spec.rope_traditional
    elif kind == "muse-glimmer":
        assert spec.max_proposals == spec.block_size - 1 and spec.sliding_window == 16
        assert set(spec.layer_types) == {"sliding_attention"}
    else:
        assert spec.target_layer_ids == (1, 3) and spec.mask_token_id == 3 and spec.max_proposals == 7


def test_a_broken_checkpoint_is_refused_clearly(drafter_dirs, tmp_path):
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(drafter_dirs["dflash"], bad)
    config = json.loads((bad / "config.json").read_text())
    del config["dflash_config"]["mask_token_id"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="mask_token_id"):
        load_dflash_checkpoint(bad)
    config["dflash_config"]["mask_token_id"] = 3
    config["num_hidden_layers"] = 2  # the file has one layer's tensors
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="do not match"):
        load_dflash_checkpoint(bad)


def test_binding_to_the_wrong_target_is_refused(drafter_dirs, tiny_llama):
    drafter = load_model_drafter(drafter_dirs["dflash"], target_vocab_size=tiny_llama.vocab_size)
    with pytest.raises(ModelLoadError, match="trained on a 4-layer target"):
        drafter.bind(tiny_llama.model)  # 2 layers; the drafter declares num_target_layers 4


# -- temperature 0 is greedy target-only decoding -----------------------------------------------


@pytest.mark.parametrize("kind", ["dflash", "dspark", "muse-glimmer"])
@pytest.mark.parametrize("probe", ["pass", "fail"])
def test_temperature_zero_is_greedy_target_decoding(kind, probe, drafter_dirs, qwen3, muse, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, probe)
    lm = target_for(kind, qwen3, muse)
    prompt = list(lm.tokenizer.encode(PROMPT))
    n = 40
    expected = plain(lm, prompt, n)
    real = load_model_drafter(drafter_dirs[kind], target_vocab_size=lm.vocab_size)
    out, counters = speculate(lm, real, prompt, n, k=6)
    assert out == expected
    assert counters.rule == GREEDY_ARGMAX and counters.rounds > 0
    assert counters.chain_rounds == (counters.rounds if probe == "fail" else 0)

    cls = type(real)
    mixed = scripted(cls, prompt + expected, wrong_every=4)(real.network, real.spec, target_vocab_size=lm.vocab_size)
    out, counters = speculate(lm, mixed, prompt, n, k=6)
    assert out == expected
    assert 0 < counters.accepted < counters.proposed  # accepts and rejects both happened


def test_every_round_keeps_drafter_context_and_target_cache_in_step(drafter_dirs, qwen3, monkeypatch):
    """The bookkeeping, round by round: the target cache holds sequence[:-1] and the drafter has
    been handed exactly those tokens' features (all-reject, partial and full acceptance)."""
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    lm = qwen3
    prompt = list(lm.tokenizer.encode(PROMPT))
    reference = prompt + plain(lm, prompt, 40)
    real = load_model_drafter(drafter_dirs["dflash"], target_vocab_size=lm.vocab_size)
    drafter = scripted(DFlashDrafter, reference, wrong=lambda p: p % 13 in (0, 1, 5))(
        real.network, real.spec, target_vocab_size=lm.vocab_size)
    cache, chain, sequence = before_the_first_round(lm, drafter, prompt)
    seen = set()
    while len(sequence) < len(reference) - 8:
        r = verify_round(lm.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=5, seed=0)
        sequence.extend(r.emitted)
        assert sequence == reference[: len(sequence)]
        assert cache_length(cache) == len(sequence) - 1 == drafter.context_length
        assert r.logits.shape[0] == r.proposed + 1
        seen.add("all" if r.accepted == r.proposed else "none" if r.accepted == 0 else "some")
    assert seen == {"all", "none", "some"}


# -- rules above temperature 0 --------------------------------------------------------------------


def test_the_default_rule_is_argmax_against_argmax_and_the_opt_in_is_stochastic(drafter_dirs, qwen3, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    params = SamplerParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=9, ignore_eos=True)
    prompt = list(qwen3.tokenizer.encode(PROMPT))
    drafter = load_model_drafter(drafter_dirs["dflash"], target_vocab_size=qwen3.vocab_size)
    out, counters = speculate(qwen3, drafter, prompt, 24, params)
    assert counters.rule == ARGMAX_AGAINST_ARGMAX
    # the biased stream it serves is the greedy one, whatever the temperature
    assert out == plain(qwen3, prompt, 24)
    _, counters = speculate(qwen3, drafter, prompt, 24, params, stochastic=True)
    assert counters.rule == STOCHASTIC
    monkeypatch.setenv("MLXCEL_SPECULATIVE_STOCHASTIC_ACCEPT", "1")
    _, counters = speculate(qwen3, drafter, prompt, 24, params)
    assert counters.rule == STOCHASTIC


def test_dflash_drafts_come_with_the_distribution_they_were_drawn_from(drafter_dirs, qwen3):
    params = SamplerParams(temperature=0.9, top_k=20, top_p=1.0, min_p=0.0, seed=3)
    drafter = load_model_drafter(drafter_dirs["dflash"], target_vocab_size=qwen3.vocab_size)
    drafter.bind(qwen3.model)
    prompt = list(qwen3.tokenizer.encode(PROMPT))
    features = prefill_with_features(qwen3.model, prompt, qwen3.make_cache(), drafter.feature_layers)
    sequence = prompt + [5]
    drafter.start(sequence, params, 3)
    drafter.observe_target(features)
    proposal = drafter.propose(sequence, 5)
    assert len(proposal.tokens) == 5 and proposal.q.shape == (5, qwen3.vocab_size)
    assert mx.allclose(proposal.q.sum(axis=-1), mx.ones(5), atol=1e-5).item()
    assert all(proposal.q[i, t].item() > 0 for i, t in enumerate(proposal.tokens))
    assert all((proposal.q[i] > 0).sum().item() <= 20 for i in range(5))  # the request's top_k shaped q


# -- DSpark declines sampling requests -------------------------------------------------------------


def test_dspark_declines_a_sampling_request_with_one_warning(drafter_dirs, qwen3, diffuse, root, caplog,
                                                            monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    target = diffuse[0]  # diffuse: a sample leaves the greedy path at once, so serving greedy would show
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=4, ignore_eos=True)
    prompt = list(target.tokenizer.encode(PROMPT))
    drafter = load_model_drafter(tiny_drafters.build_dspark(root / "diffuse-dspark", target.path),
                                 target_vocab_size=target.vocab_size)
    with caplog.at_level(logging.WARNING):
        out, counters = speculate(target, drafter, prompt, 20, params)
    warnings = [r for r in caplog.records if "greedy chains only" in r.getMessage()]
    assert len(warnings) == 1
    assert counters.rounds == 0 and counters.plain_steps > 0  # no drafting at all
    assert out == plain(target, prompt, 20, params)  # plain sampling, same seed, same tokens
    assert out != plain(target, prompt, 20)  # ... which is not the greedy stream
    # top_k 1 is argmax: served by the drafter
    drafter = load_model_drafter(drafter_dirs["dspark"], target_vocab_size=qwen3.vocab_size)
    prompt = list(qwen3.tokenizer.encode(PROMPT))
    out, counters = speculate(qwen3, drafter, prompt, 20, SamplerParams(temperature=0.8, top_k=1, ignore_eos=True))
    assert counters.rounds > 0


def test_muse_starts_at_four_rows_and_widens_when_the_window_pays(drafter_dirs, muse, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    prompt = list(muse.tokenizer.encode(PROMPT))
    expected = plain(muse, prompt, 60)
    real = load_model_drafter(drafter_dirs["muse-glimmer"], target_vocab_size=muse.vocab_size)
    oracle = scripted(MuseGlimmerDrafter, prompt + expected, wrong_every=10 ** 9)(
        real.network, real.spec, target_vocab_size=muse.vocab_size)
    out, _ = speculate(muse, oracle, prompt, 60, k=7)
    assert out == expected
    widths = oracle.width_log
    assert widths[0] == DECLARED_DEPTH and set(widths[:4]) == {DECLARED_DEPTH}
    assert max(widths) == 8 and oracle.widened  # 7 drafts + the pending row

    # a drafter that never gets anything accepted never widens
    out, _ = speculate(muse, real, prompt, 40, k=7)
    assert max(real.width_log) == DECLARED_DEPTH and not real.widened


def test_muse_settles_back_at_four_rows_when_the_wide_block_does_not_pay(drafter_dirs, muse, monkeypatch):
    """The warm-up saturates (every draft right), the loop widens to the ceiling; from then on the
    drafts go wrong every fourth position, so a wide round accepts at most three, which four rows
    could have: after one measurement window at the ceiling the loop goes back to four rows and stays
    there for the rest of the request. The output is greedy target decoding throughout."""
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    prompt = list(muse.tokenizer.encode(PROMPT))
    expected = plain(muse, prompt, 80)
    switch = len(prompt) + 1 + 4 * DECLARED_DEPTH  # past the warm-up window (4 rounds of 4 tokens)
    real = load_model_drafter(drafter_dirs["muse-glimmer"], target_vocab_size=muse.vocab_size)
    drafter = scripted(MuseGlimmerDrafter, prompt + expected,
                       wrong=lambda p: p >= switch and (p - switch) % 4 == 3)(
        real.network, real.spec, target_vocab_size=muse.vocab_size)
    out, _ = speculate(muse, drafter, prompt, 80, k=7)
    assert out == expected
    widths = drafter.width_log
    wide = [i for i, w in enumerate(widths) if w == 8]
    assert widths[:4] == [DECLARED_DEPTH] * 4 and len(wide) == 4 and drafter.widened  # one window at the ceiling
    assert drafter.settled and drafter.rows == DECLARED_DEPTH
    after = widths[wide[-1] + 1:]
    assert after and max(after) == DECLARED_DEPTH  # and never widens again (shorter: the budget's end)


def test_muse_clears_both_widths_with_the_probe_before_the_first_block(drafter_dirs, muse, monkeypatch):
    """The gate asks about the warm-up width and the ceiling before the first block is scored in one
    forward (the verdicts here are recorded stand-ins for the probe: what is pinned is which widths
    the round loop asks about; the probe itself is tested in test_exactness_probe.py)."""
    monkeypatch.setenv(switches.PROBE_ENV, "auto")
    exactness_probe.forget(muse.model)
    asked = []

    def recording_probe(model, width, **kw):
        asked.append(width)
        return exactness_probe.ProbeVerdict(width, True, 0.0, 0, "probe")

    monkeypatch.setattr(exactness_probe, "probe", recording_probe)
    prompt = list(muse.tokenizer.encode(PROMPT))
    drafter = load_model_drafter(drafter_dirs["muse-glimmer"], target_vocab_size=muse.vocab_size)
    cache, chain, sequence = before_the_first_round(muse, drafter, prompt)
    r = verify_round(muse.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=7, seed=0)
    assert r.proposed == DECLARED_DEPTH - 1 and not r.chain_verified
    assert sorted(asked) == [DECLARED_DEPTH, 8]  # both widths before the first (4-row) block
    sequence.extend(r.emitted)
    r = verify_round(muse.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=7, seed=0)
    sequence.extend(r.emitted)
    assert sorted(asked) == [DECLARED_DEPTH, 8]  # memoized: nothing probed twice

    # the ceiling failing sends even a warm-up-width round to chain decoding
    exactness_probe.forget(muse.model)
    monkeypatch.setattr(exactness_probe, "probe", lambda model, width, **kw: exactness_probe.ProbeVerdict(
        width, width != 8, 1e-6, 3, "probe"))
    r = verify_round(muse.model, cache, chain, drafter, sequence, rule=GREEDY_ARGMAX, k=7, seed=0)
    assert r.proposed == DECLARED_DEPTH - 1 and r.chain_verified
    exactness_probe.forget(muse.model)


@pytest.fixture(scope="module")
def diffuse(root):
    """A target and drafter with diffuse, overlapping p and q (the stochastic rule accepts often)."""
    target = load_model(tiny_drafters.build_target(root / "diffuse", "qwen3", seed=3, logit_scale=0.08))
    return target, tiny_drafters.build_dflash(root / "diffuse-d", target.path, layer_ids=(1, 3), logit_scale=0.04)


@pytest.mark.parametrize("stochastic", [True, False])
def test_chain_verify_makes_the_block_paths_decisions(diffuse, stochastic, monkeypatch):
    """Same seed, same drafts: verifying token by token (probe failed) emits exactly what the block
    path emits, on both branches of the stochastic rule (accepts, residual draws, bonus draws)."""
    target, drafter_dir = diffuse
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=21, ignore_eos=True)
    prompt = list(target.tokenizer.encode(PROMPT))
    runs = {}
    for probe in ("pass", "fail"):
        monkeypatch.setenv(switches.PROBE_ENV, probe)
        drafter = load_model_drafter(drafter_dir, target_vocab_size=target.vocab_size)
        runs[probe] = speculate(target, drafter, prompt, 120, params, stochastic=stochastic)
    (block, c_block), (chain, c_chain) = runs["pass"], runs["fail"]
    assert block == chain
    assert c_chain.chain_rounds == c_chain.rounds > 0 and c_block.chain_rounds == 0
    assert (c_block.accepted, c_block.positions_tested) == (c_chain.accepted, c_chain.positions_tested)
    if stochastic:
        assert 0 < c_block.accepted < c_block.positions_tested
