"""Embeddings from a tiny real checkpoint: the chunked hidden states are mlx-lm's own final-norm
output, each pooling picks what it names, normalisation follows upstream's rules, and a rank head
computes its documented formula."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.embedding.pooling import embed, hidden_states, normalize, pooled
from mlxcel.engine.embedding.rank_head import gguf_rank_head

TOKENS = [5, 17, 42, 99, 3, 250, 11, 8, 64, 120, 7]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """mlx-lm's decoder stack over the whole sequence at once: its output is the final norm's."""
    return np.array(tiny_llama.model.model(mx.array([TOKENS]))[0])


def test_chunked_hidden_states_are_the_final_norm_output(tiny_llama, reference):
    for step in (3, 512):
        h = np.array(hidden_states(tiny_llama.model, TOKENS, step=step))
        assert h.shape == reference.shape
        np.testing.assert_allclose(h, reference, rtol=1e-4, atol=1e-4)


def test_poolings(tiny_llama, reference):
    h = hidden_states(tiny_llama.model, TOKENS)
    np.testing.assert_allclose(pooled(h, "none"), reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pooled(h, "mean"), reference.mean(axis=0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pooled(h, "cls"), reference[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pooled(h, "last"), reference[-1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pooled(h, "rank"), reference[-1], rtol=1e-4, atol=1e-4)  # no head: llama.cpp's row
    v = embed(tiny_llama.model, TOKENS, "last")
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    np.testing.assert_allclose(v, reference[-1] / np.linalg.norm(reference[-1]), rtol=1e-4, atol=1e-5)
    assert embed(tiny_llama.model, TOKENS, "none").shape == reference.shape  # rows are never normalised


def test_normalisations():
    v = np.array([3.0, -4.0, 0.0, 1.0], dtype=np.float32)
    np.testing.assert_allclose(normalize(v, -1), v)
    np.testing.assert_allclose(normalize(v, 0), v / 4.0 * 32760.0, rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 1), v / 8.0, rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 2), v / np.sqrt(26.0), rtol=1e-6)
    np.testing.assert_allclose(normalize(v, 3), v / (27 + 64 + 1) ** (1 / 3), rtol=1e-6)
    assert not normalize(np.zeros(3, np.float32), 2).any()


def test_rank_heads():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(4, 8)).astype(np.float32)
    dense, bias = rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    out, out_bias = rng.normal(size=(1, 8)).astype(np.float32), np.array([0.5], np.float32)
    head = gguf_rank_head({"cls.weight": mx.array(dense), "cls.bias": mx.array(bias),
                           "cls.output.weight": mx.array(out), "cls.output.bias": mx.array(out_bias)}, "bert")
    expected = out @ np.tanh(dense @ hidden[-1] + bias) + out_bias
    assert head.score(mx.array(hidden)) == pytest.approx(float(expected[0]), rel=1e-5)
    qwen = gguf_rank_head({"cls.output.weight": mx.array(rng.normal(size=(2, 8)).astype(np.float32))}, "qwen3")
    probs = np.array(qwen.outputs(mx.array(hidden)))
    assert qwen.softmax and probs.sum() == pytest.approx(1.0, rel=1e-6) and 0 < qwen.score(mx.array(hidden)) < 1
    assert gguf_rank_head({}, "llama") is None
    # a lone cls.weight (jina-reranker-v1) is the dense layer: llama.cpp scores its tanh output
    single = gguf_rank_head({"cls.weight": mx.array(out)}, "jina-bert-v2")
    assert single.output is None and not single.softmax
    assert single.score(mx.array(hidden)) == pytest.approx(float(np.tanh(out @ hidden[-1])[0]), rel=1e-5)
    assert single.score(mx.array(hidden), row=0) == pytest.approx(float(np.tanh(out @ hidden[0])[0]), rel=1e-5)


def test_encoder_only_checkpoints_are_refused_clearly(tmp_path):
    import json

    from mlxcel.engine.errors import ModelLoadError
    from mlxcel.engine.model.loading import load_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelLoadError, match="encoder-only"):
        load_model(tmp_path)
