"""The block-versus-chain exactness probe and the chain-decoding fallback.

* the verdict is the bitwise comparison itself (checked against an independent computation on
  the tiny llama at several widths; on this project's CPU build, f32 + OpenBLAS, width 2 agrees
  and wider blocks do not, which is why the fallback matters here);
* a target whose block forward differs from its one-token forwards fails the probe, one whose
  block forward is computed token by token passes it; verdicts are memoized per (model, width);
* the probe works past a rotating cache's window (contexts longer than the window);
* a failing probe sends model-based rounds to chain decoding, says so once in the log, and the
  output is still exactly greedy target decoding; and with the real verdict, whatever it is.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import pytest
import tiny_drafters
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters.loading import load_model_drafter
from mlxcel.engine.errors import MlxcelError
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import exactness_probe, switches

GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)


class Wrapped:
    """A target seen through a different forward: ``mode="skewed"`` adds a tiny offset to every
    multi-token forward (a width-dependent kernel, exaggerated); ``mode="serial"`` computes a
    multi-token forward one token at a time (width-invariant by construction)."""

    def __init__(self, inner, mode: str):
        self._inner, self._mode = inner, mode

    def __call__(self, x, cache=None):
        if x.shape[1] > 1 and self._mode == "serial":
            return mx.concatenate([self._inner(x[:, i : i + 1], cache=cache) for i in range(x.shape[1])], axis=1)
        out = self._inner(x, cache=cache)
        return out + 1e-6 if x.shape[1] > 1 and self._mode == "skewed" else out

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture(autouse=True)
def fresh_memo():
    exactness_probe.forget()
    yield
    exactness_probe.forget()


def direct_comparison(lm, width):
    key = mx.random.key(width)
    tokens = mx.random.randint(0, lm.vocab_size, (11 + width,), key=key).tolist()
    one, chain = lm.make_cache(), lm.make_cache()
    lm.model(mx.array([tokens[:11]]), cache=one)
    lm.model(mx.array([tokens[:11]]), cache=chain)
    a = lm.model(mx.array([tokens[11:]]), cache=one)[0]
    b = mx.concatenate([lm.model(mx.array([[t]]), cache=chain)[0] for t in tokens[11:]])
    return bool(mx.array_equal(a, b).item())


def test_the_verdict_is_the_bitwise_comparison(tiny_llama):
    for width in (2, 3, 5, 8):
        verdict = exactness_probe.probe(tiny_llama.model, width, vocab_size=tiny_llama.vocab_size, draws=1)
        assert verdict.exact == direct_comparison(tiny_llama, width)
        assert verdict.exact == (verdict.max_abs_diff == 0.0)


def test_width_dependent_forwards_fail_and_width_invariant_ones_pass(tiny_llama):
    skewed = Wrapped(tiny_llama.model, "skewed")
    serial = Wrapped(tiny_llama.model, "serial")
    for width in (2, 4):
        bad = exactness_probe.probe(skewed, width, vocab_size=tiny_llama.vocab_size,
                                    make_cache=tiny_llama.make_cache)
        assert not bad.exact and bad.max_abs_diff > 0
        good = exactness_probe.probe(serial, width, vocab_size=tiny_llama.vocab_size,
                                     make_cache=tiny_llama.make_cache)
        assert good.exact and good.draws == exactness_probe.PROBE_DRAWS


def test_verdicts_are_memoized_per_model_and_width(tiny_llama, monkeypatch):
    calls = []
    real = exactness_probe.probe
    monkeypatch.setattr(exactness_probe, "probe", lambda model, width, **kw: calls.append(width) or real(
        model, width, **kw))
    serial = Wrapped(tiny_llama.model, "serial")
    for _ in range(3):
        assert exactness_probe.block_verdict(serial, 4, vocab_size=tiny_llama.vocab_size,
                                             make_cache=tiny_llama.make_cache).exact
    exactness_probe.block_verdict(serial, 5, vocab_size=tiny_llama.vocab_size, make_cache=tiny_llama.make_cache)
    assert calls == [4, 5]


def test_the_environment_injects_a_verdict_and_rejects_nonsense(tiny_llama, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "fail")
    assert not exactness_probe.block_verdict(tiny_llama.model, 2, vocab_size=tiny_llama.vocab_size).exact
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    verdict = exactness_probe.block_verdict(tiny_llama.model, 9, vocab_size=tiny_llama.vocab_size)
    assert verdict.exact and verdict.source == "env"
    monkeypatch.setenv(switches.PROBE_ENV, "maybe")
    with pytest.raises(MlxcelError, match=switches.PROBE_ENV):
        switches.probe_mode()


def test_the_probe_runs_past_a_rotating_caches_window(tmp_path):
    muse = load_model(tiny_drafters.build_target(tmp_path / "muse", "muse_glimmer", seed=5, window=8))
    seen = []

    class Spy(Wrapped):
        def __call__(self, x, cache=None):
            if x.shape[1] > 1 and cache[0].offset >= cache[0].max_size:
                seen.append((cache[0].offset, cache[0].max_size))
            return super().__call__(x, cache)

    for mode, exact in (("serial", True), ("skewed", False)):
        verdict = exactness_probe.probe(Spy(muse.model, mode), 4, vocab_size=muse.vocab_size,
                                        make_cache=muse.make_cache)
        assert verdict.exact is exact
    assert seen and all(offset > window for offset, window in seen)  # blocks scored on wrapped windows


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe-pair")
    target = load_model(tiny_drafters.build_target(root / "t", "qwen3", seed=3))
    return target, tiny_drafters.build_dflash(root / "d", target.path, layer_ids=(1, 3))


def plain(lm, prompt, n):
    return target_only_tokens(lm, prompt, GREEDY, n)


def test_a_failing_probe_falls_back_to_chain_decoding_and_says_so_once(pair, caplog, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "auto")
    lm, drafter_dir = pair
    skewed = load_model(lm.path)
    skewed.model = Wrapped(skewed.model, "skewed")
    prompt = list(lm.tokenizer.encode("The quick brown fox jumps over the lazy dog."))
    drafter = load_model_drafter(drafter_dir, target_vocab_size=lm.vocab_size)
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine.speculative.exactness_probe"):
        out, counters = speculative_tokens(skewed, drafter, prompt, GREEDY, 30, k=5)
    assert out == plain(lm, prompt, 30)
    assert counters.rounds > 0 and counters.chain_rounds == counters.rounds
    fallbacks = [r for r in caplog.records if "chain decoding" in r.getMessage()]
    widths = {int(r.getMessage().split("width ")[1].split(":")[0]) for r in fallbacks}
    assert len(fallbacks) == len(widths)  # once per width, however many rounds ran at it


def test_end_to_end_with_the_real_verdict(pair, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "auto")
    lm, drafter_dir = pair
    prompt = list(lm.tokenizer.encode("Hello, world! How are you today?"))
    drafter = load_model_drafter(drafter_dir, target_vocab_size=lm.vocab_size)
    out, counters = speculative_tokens(lm, drafter, prompt, GREEDY, 30, k=5)
    assert out == plain(lm, prompt, 30)
    verdict = exactness_probe.block_verdict(lm.model, 6, vocab_size=lm.vocab_size)
    assert (counters.chain_rounds > 0) == (not verdict.exact)
