"""Every drafter kind on the targets whose caches hold recurrent state: Qwen3.5 and Qwen3-Next
(gated-delta linear attention, with their own MTP layers) and LFM2 (short convolutions), tiny
random checkpoints in the published layouts, plus Gemma 4 with its MTP assistant.

* temperature 0 is greedy target-only decoding token for token, for every kind x target (the MTP
  kind where the target has MTP layers), with the real drafter and with a scripted one whose drafts
  are partly the target's own tokens (accepts and rejects both happen, so blocks are cut back at
  every length); model-based drafters verify blocks in one forward here (probe verdict ``pass``),
  the path that cuts recurrent layers back with the round's state tape;
* sampler-match keeps seed invariance on a hybrid target, argmax-against-argmax serves its greedy
  stream, and the Gemma 4 assistant reads the target's K/V past a wrapped sliding window.

The whole matrix runs in the default suite (about 25 s here); the Gemma 4 assistant's chain path
(verified token by token) in the slow one.
"""

from __future__ import annotations

import pytest
import tiny_drafters
import tiny_mtp
from target_only import speculative_tokens, target_only_tokens

from mlxcel.drafters import registry
from mlxcel.drafters.draft_model import DraftModelDrafter
from mlxcel.drafters.loading import load_model_drafter
from mlxcel.drafters.lookup.prompt_lookup import PromptLookupDrafter
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.engine.speculative import switches
from mlxcel.engine.speculative.acceptance import ARGMAX_AGAINST_ARGMAX, GREEDY_ARGMAX, SAMPLER_MATCH

GREEDY = SamplerParams(temperature=0.0, ignore_eos=True)
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
N = 32
KINDS = ("prompt-lookup", "draft-model", "dflash", "dspark", "muse-glimmer", "mtp")
TARGETS = ("qwen3_5", "qwen3_next", "lfm2")


def matrix():
    for kind in KINDS:
        for target in TARGETS:
            if kind == "mtp" and target == "lfm2":
                continue  # LFM2 ships no MTP layers
            yield pytest.param(kind, target, id=f"{kind}-{target}")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hybrid-drafters")


def build(kind: str, target: str, lm, target_dir, root):
    """The real drafter of ``kind`` for ``target`` and, for the model-based ones, its class (scripted)."""
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    if kind == "draft-model":  # a sibling of the target's own family: a hybrid draft model with its own cache
        sibling = tiny_drafters.build_target(root / f"sibling-{target}", target, seed=9)
        return DraftModelDrafter(load_model(sibling), target_vocab_size=lm.vocab_size)
    if kind == "mtp":
        return load_model_drafter(None, registry.INTERNAL_MTP, lm)
    out = root / f"{kind}-{target}"
    if not out.exists():
        if kind == "dflash":
            tiny_drafters.build_dflash(out, target_dir, layer_ids=(1, 3))
        elif kind == "dspark":
            tiny_drafters.build_dspark(out, target_dir, layer_ids=(0, 2))
        else:
            tiny_drafters.build_muse_assistant(out, target_dir, layer_ids=(1, 2), window=16)
    return load_model_drafter(out, target_vocab_size=lm.vocab_size)


def scripted(drafter, reference: list[int], wrong_every: int = 4):
    """``drafter`` (a model-based one: the real network, context bookkeeping and round loop all run),
    but each draft is the target's own greedy token at its position except every ``wrong_every``-th."""

    class Scripted(type(drafter)):
        def _draw(self, logits, history, position):
            super()._draw(logits, history, position)
            if position >= len(reference):
                return 0, None
            token = reference[position]
            return ((token + 1) % 50 if position % wrong_every == 0 else token), None

    drafter.__class__ = Scripted
    return drafter


@pytest.mark.parametrize("kind,target", list(matrix()))
def test_temperature_zero_is_greedy_target_decoding(kind, target, hybrid, hybrid_dirs, root, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    lm = hybrid[target]
    prompt = list(lm.tokenizer.encode(PROMPT))
    want = target_only_tokens(lm, prompt, GREEDY, N)
    drafter = build(kind, target, lm, hybrid_dirs[target], root)
    got, counters = speculative_tokens(lm, drafter, prompt, GREEDY, N, k=4)
    assert got == want
    assert counters.rule == GREEDY_ARGMAX and counters.rounds > 0
    if kind == "draft-model":  # the target drafting for itself: every draft accepted, blocks kept whole
        same = DraftModelDrafter(load_model(hybrid_dirs[target]))
        got, counters = speculative_tokens(lm, same, prompt, GREEDY, N, k=4)
        assert got == want and counters.accepted == counters.proposed > 0
    elif kind != "prompt-lookup":
        mixed = scripted(build(kind, target, lm, hybrid_dirs[target], root), prompt + want)
        got, counters = speculative_tokens(lm, mixed, prompt, GREEDY, N, k=4)
        assert got == want
        assert 0 < counters.accepted < counters.proposed  # accepts and rejects: blocks cut back at every length


def test_sampler_match_keeps_the_seeds_tokens_on_a_hybrid_target(hybrid, hybrid_dirs, root):
    lm = hybrid["lfm2"]
    prompt = list(lm.tokenizer.encode(PROMPT))
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=17, ignore_eos=True)
    want = target_only_tokens(lm, prompt, params, N)
    got, counters = speculative_tokens(lm, build("draft-model", "lfm2", lm, hybrid_dirs["lfm2"], root), prompt,
                                       params, N, k=3)
    assert counters.rule == SAMPLER_MATCH and counters.rounds > 0
    assert got == want


def test_argmax_against_argmax_serves_the_greedy_stream_on_a_hybrid_target(hybrid, hybrid_dirs, root, monkeypatch):
    monkeypatch.setenv(switches.PROBE_ENV, "pass")
    lm = hybrid["qwen3_5"]
    prompt = list(lm.tokenizer.encode(PROMPT))
    params = SamplerParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=5, ignore_eos=True)
    got, counters = speculative_tokens(lm, build("dflash", "qwen3_5", lm, hybrid_dirs["qwen3_5"], root), prompt,
                                       params, N, k=4)
    assert counters.rule == ARGMAX_AGAINST_ARGMAX
    assert got[1:] == target_only_tokens(lm, prompt + got[:1], GREEDY, N - 1)  # after the prefill's own draw


@pytest.mark.parametrize("probe", ["pass", pytest.param("fail", marks=pytest.mark.slow)])
def test_gemma4_assistant_is_greedy_target_decoding_past_the_window(root, probe, monkeypatch):
    """The assistant attends to the target's sliding-window cache (16 tokens; prompt + output run
    past it) and full-attention cache; its centroid head keeps two of eight centroids (the real
    drafter) or all of them (the echo drafter, whose drafts the target's looping stream accepts)."""
    monkeypatch.setenv(switches.PROBE_ENV, probe)
    target_dir = tiny_drafters.build_target(root / "gemma4", "gemma4", seed=3, window=16)
    lm = load_model(target_dir)
    prompt = list(lm.tokenizer.encode(PROMPT))
    want = target_only_tokens(lm, prompt, GREEDY, N)
    assert len(prompt) + N > 16
    for echo in (False, True):
        path = root / f"gemma4-assistant-{echo}"
        if not path.exists():
            tiny_mtp.build_gemma4_assistant(path, target_dir, echo=echo)
        assert registry.choose(draft_model=str(path)).kind is registry.MTP
        drafter = load_model_drafter(path, registry.MTP, lm)
        got, counters = speculative_tokens(lm, drafter, prompt, GREEDY, N, k=3)
        assert got == want and counters.rounds > 0
        assert counters.chain_rounds == (counters.rounds if probe == "fail" else 0)
        mixed = scripted(load_model_drafter(path, registry.MTP, lm), prompt + want)
        got, counters = speculative_tokens(lm, mixed, prompt, GREEDY, N, k=3)
        assert got == want and 0 < counters.accepted < counters.proposed
