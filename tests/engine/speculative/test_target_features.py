"""The feature forward (engine.speculative.target_features) returns the very logits the target computes.

Zero tolerance: its logits equal ``model(tokens, cache)`` bitwise on tiny llama, qwen2, qwen3 and
muse glimmer checkpoints (real mlx-lm models, real caches and masks), over a prefill and a
following block; the recorded layers are the decoder layers' outputs; the head rebuilt from the
normalised hidden state reproduces the logits; and the model is left exactly as it was.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny_drafters

from mlxcel.engine.cache.prefill import prefill
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.speculative.target_features import (
    FeaturesUnsupported,
    TargetFeatures,
    embed,
    forward_with_features,
    head_logits,
    prefill_with_features,
)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "muse_glimmer"])
def target(request, tmp_path_factory):
    return load_model(tiny_drafters.build_target(tmp_path_factory.mktemp(request.param) / "t", request.param,
                                                 seed=4, window=16))


def test_logits_are_the_models_own_bit_for_bit(target):
    ref_cache, cache = target.make_cache(), target.make_cache()
    context = list(range(5, 25))  # past the muse window of 16, so the rotating caches wrap
    ref = target.model(mx.array([context]), cache=ref_cache)[0]
    got = forward_with_features(target.model, context, cache, [0, 2])
    assert mx.array_equal(ref, got.logits).item()
    for block in ([40, 41, 42, 43], [44]):
        ref = target.model(mx.array([block]), cache=ref_cache)[0]
        got = forward_with_features(target.model, block, cache, [1])
        assert mx.array_equal(ref, got.logits).item()
        assert got.length == len(block)


def test_recorded_rows_are_the_decoder_layers_outputs(target):
    inner = target.model.model
    features = forward_with_features(target.model, [9, 8, 7], target.make_cache(), [0, len(inner.layers) - 1])
    assert mx.array_equal(features.layers[len(inner.layers) - 1], features.hidden).item()
    assert mx.array_equal(inner.norm(features.hidden[None])[0], features.normed).item()
    assert mx.array_equal(head_logits(target.model, features.normed), features.logits).item()
    assert features.concat([0, len(inner.layers) - 1]).shape == (3, 2 * features.hidden.shape[-1])
    assert embed(target.model, [9]).shape == (1, features.hidden.shape[-1])
    # nothing of the recording is left behind
    assert all(type(layer).__name__ != "_Recorder" for layer in inner.layers)
    assert type(inner.norm).__name__ != "_Recorder"


def test_prefill_with_features_matches_plain_prefill(target):
    tokens = list(range(3, 40))
    ref = prefill(target.model, tokens, target.make_cache(), step=8)
    got = prefill_with_features(target.model, tokens, target.make_cache(), [1], step=8)
    assert mx.array_equal(ref[None], got.logits).item()
    assert got.length == len(tokens)
    whole = forward_with_features(target.model, tokens, target.make_cache(), [1], logits=False)
    assert mx.allclose(whole.layers[1], got.layers[1], atol=1e-4).item()


def test_rows_and_join_round_trip():
    a = TargetFeatures(mx.arange(6).reshape(3, 2), {0: mx.arange(9).reshape(3, 3)}, mx.zeros((3, 3)), mx.ones((3, 3)))
    parts = [a.rows(0, 1), a.rows(1, 3)]
    joined = TargetFeatures.join(parts)
    assert mx.array_equal(joined.logits, a.logits).item() and mx.array_equal(joined.layers[0], a.layers[0]).item()


def test_a_layer_the_target_lacks_is_a_clear_error(tiny_llama):
    with pytest.raises(FeaturesUnsupported, match="target has 2 layers"):
        forward_with_features(tiny_llama.model, [1], tiny_llama.make_cache(), [5])
