"""Recurrent layers under speculation (``engine.cache.recurrent``), on tiny real checkpoints:

* a block forward recorded on a ``StateTape`` is cut back to any kept prefix, and every layer of the
  cache (recurrent and attention) then holds bit for bit what a forward of exactly the kept tokens
  leaves (widths >= 2: a one-row forward takes another matmul kernel on this CPU), for the captured
  mixers (Qwen3.5 / Qwen3-Next gated delta, LFM2 short convolution) and for the replay of any
  other (Mamba; and the captured ones forced to replay, which must agree with capture bit for bit);
* without a tape, or past what the forward fed, the rewind is refused and nothing changes;
* a target whose state a round cannot restore is reported (Falcon-H1's combined per-layer caches);
* a drafter's ``StateMarks`` go back to any marked length.

On a CPU with the float32 tiles the hybrids take the fused ops (``device.FUSED_FLOAT_TYPES``), so
the cut-back is checked with them.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_checkpoints

from mlxcel.engine.cache import recurrent
from mlxcel.engine.cache.kv_cache import can_rewind, read_keys_values, rewind
from mlxcel.engine.cache.recurrent import REPLAY, StateMarks, StateTape, unsupported_reason
from mlxcel.engine.errors import CacheRewindError
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import device
from mlxcel.engine.platform.fused_layers import FusedRMSNorm, RowwiseLinear

PROMPT = [5, 6, 7, 8, 9, 10, 11]
BLOCK = [12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def mamba(checkpoints_root):
    return load_model(tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-mamba", "mamba", seed=4))


def contents(cache) -> list[mx.array]:
    out = []
    for c in cache:
        if hasattr(c, "cache"):
            out += [a for a in c.cache if a is not None]
        else:
            out += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return out


def cut_back(lm, kept: int, strategy=None):
    cache = lm.make_cache()
    lm.model(mx.array([PROMPT]), cache=cache)
    tape = StateTape(lm.model, cache, strategy=strategy)
    with tape.recording():
        mx.eval(lm.model(mx.array([BLOCK]), cache=cache))
    assert can_rewind(cache, len(BLOCK) - kept, tape)
    rewind(cache, len(BLOCK) - kept, tape)
    return cache, tape


def fresh(lm, kept: int):
    cache = lm.make_cache()
    lm.model(mx.array([PROMPT]), cache=cache)
    lm.model(mx.array([BLOCK[:kept]]), cache=cache)
    return cache


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next", "lfm2"])
def test_a_captured_block_cuts_back_to_what_the_kept_tokens_leave(hybrid, arch):
    lm = hybrid[arch]
    for kept in (2, 3, 5):
        cache, tape = cut_back(lm, kept)
        assert {r.strategy for r in tape.records.values()} == {recurrent.CAPTURE}
        for a, b in zip(contents(cache), contents(fresh(lm, kept)), strict=True):
            assert mx.array_equal(a, b).item(), (arch, kept)
        after = lm.model(mx.array([[20, 21]]), cache=cache)
        assert mx.array_equal(after, lm.model(mx.array([[20, 21]]), cache=fresh(lm, kept))).item()


def test_on_the_cpu_kernels_the_hybrids_run_the_fused_ops(hybrid):
    """So the cut-back above is checked with what a CPU target decodes with: the fused norms, and
    Qwen3-Next's 1-output shared-expert gate (and its 4-way router here) off OpenBLAS, whose
    narrow products round a row differently with the forward's width (fused_layers.RowwiseLinear;
    without it the Qwen3-Next case above fails)."""
    if not device.float_kernels():
        pytest.skip("no float32 tiles here: the hybrids keep MLX's ops")
    for arch, lm in hybrid.items():
        kinds = {type(m) for _, m in lm.model.named_modules()}
        assert FusedRMSNorm in kinds, arch
    gate = hybrid["qwen3_next"].model.model.layers[0].mlp.shared_expert_gate
    assert type(gate) is RowwiseLinear


@pytest.mark.parametrize("arch", ["qwen3_5", "lfm2"])
def test_replay_and_capture_agree_bit_for_bit(hybrid, arch):
    lm = hybrid[arch]
    for kept in (2, 3, 4):  # a one-row replay runs the one-row matmul kernel, so not kept == 1
        captured, _ = cut_back(lm, kept)
        replayed, tape = cut_back(lm, kept, strategy=REPLAY)
        assert {r.strategy for r in tape.records.values()} == {REPLAY}
        for a, b in zip(contents(captured), contents(replayed), strict=True):
            assert mx.array_equal(a, b).item(), (arch, kept)


def test_any_other_recurrent_layer_is_replayed(mamba):
    """Mamba: every layer recurrent, a mixer the tape knows nothing about. Its selective scan is not
    width-invariant on this CPU, so the replayed state (the mixer over the kept rows of the inputs the
    block saw) matches a fresh forward of the kept tokens to float precision, not bit for bit."""
    assert unsupported_reason(mamba.model) is None
    for kept in (1, 2, 4):
        cache, tape = cut_back(mamba, kept)
        assert {r.strategy for r in tape.records.values()} == {REPLAY}
        for a, b in zip(contents(cache), contents(fresh(mamba, kept)), strict=True):
            assert mx.allclose(a, b, atol=1e-5, rtol=1e-5).item(), kept


def test_without_a_tape_or_past_its_forward_the_rewind_is_refused(hybrid):
    lm = hybrid["qwen3_5"]
    cache = lm.make_cache()
    lm.model(mx.array([PROMPT]), cache=cache)
    before = [mx.array(a) for a in contents(cache)]
    assert not can_rewind(cache, 1)
    with pytest.raises(CacheRewindError, match="recurrent state cannot be rewound"):
        rewind(cache, 1)
    tape = StateTape(lm.model, cache)
    with tape.recording():
        lm.model(mx.array([BLOCK[:2]]), cache=cache)
    assert not can_rewind(cache, 3, tape)  # only 2 tokens were recorded
    with pytest.raises(CacheRewindError):
        rewind(cache, 3, tape)
    rewind(cache, 2, tape)  # all of them: back to the state before the forward
    assert all(mx.array_equal(a, b).item() for a, b in zip(contents(cache), before, strict=True))


def test_a_target_whose_state_cannot_be_restored_is_reported(checkpoints_root, hybrid):
    falcon = load_model(tiny_checkpoints.build_hf_checkpoint(checkpoints_root / "tiny-falcon-h1", "falcon_h1"))
    assert "CacheList" in unsupported_reason(falcon.model)
    for lm in hybrid.values():
        assert unsupported_reason(lm.model) is None


def test_marks_go_back_to_any_marked_length(hybrid):
    lm = hybrid["lfm2"]
    cache = lm.make_cache()
    marks = StateMarks(cache)
    lm.model(mx.array([PROMPT]), cache=cache)
    marks.mark(len(PROMPT))
    for i, t in enumerate(BLOCK):
        lm.model(mx.array([[t]]), cache=cache)
        marks.mark(len(PROMPT) + i + 1)
    rewind(cache, 3, marks)
    marks.rewound(3)
    want = lm.make_cache()
    lm.model(mx.array([PROMPT]), cache=want)
    for t in BLOCK[:2]:
        lm.model(mx.array([[t]]), cache=want)
    assert all(mx.array_equal(a, b).item() for a, b in zip(contents(cache), contents(want), strict=True))
    assert set(marks.marks) == {len(PROMPT) + 2}


def test_a_wrapped_sliding_window_reads_as_the_committed_tokens(checkpoints_root):
    """What a drafter reading the target's cache sees (``read_keys_values``) after verify-shaped forwards
    and rewinds past a 16-token window equals a fresh prefill of the same tokens, position for position."""
    import tiny_drafters

    lm = load_model(tiny_drafters.build_target(checkpoints_root / "tiny-gemma4-read", "gemma4", seed=3, window=16))
    seq = list(range(3, 40))
    cache = lm.make_cache()
    lm.model(mx.array([seq[:20]]), cache=cache)
    for start in range(20, 36, 4):  # blocks of 5, keeping 4
        lm.model(mx.array([seq[start:start + 5]]), cache=cache)
        rewind(cache, 1)
    want = lm.make_cache()
    lm.model(mx.array([seq[:36]]), cache=want)
    for c, w in zip(cache, want, strict=True):
        k, v, first = read_keys_values(c)
        wk, wv, wfirst = read_keys_values(w)
        n = min(k.shape[2], wk.shape[2])
        assert first + k.shape[2] == wfirst + wk.shape[2] == 36
        assert mx.allclose(k[..., -n:, :], wk[..., -n:, :], atol=1e-5).item()
        assert mx.allclose(v[..., -n:, :], wv[..., -n:, :], atol=1e-5).item()
