"""BERT-family GGUF encoders served by a real mlxcel-server: ``/v1/embeddings`` and ``/embedding`` on
a bge-style embedder (CLS pooling named by the file) and ``/rerank`` on a RoBERTa-style sequence
classifier (bge-reranker's head: dense + tanh + out_proj), both against the float64 reference of
``encoder_reference`` on the checkpoint the GGUF holds, with the inputs laid out as llama-server
lays them out (``[CLS] text [SEP]``; ``[CLS] query [SEP] document [SEP]``). Completions on such a
server are refused, and an encoder without ``--embeddings`` / ``--reranking`` is not served."""

from __future__ import annotations

import encoder_reference as ref
import httpx
import numpy as np
import pytest
import tiny_encoders
from server_process import ServerProcess, post_ok

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
         "def add(a, b):\n    return a + b", "The capital of France is Paris."]
QUERY = "What is the capital of France?"
DOCS = ["The capital of Italy is Rome.", "Hello, world! How are you today?", "The capital of France is Paris.",
        "def add(a, b):\n    return a + b\n"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A bert embedder (CLS pooling, as bge's sentence-transformers config names it) and a RoBERTa
    reranker, as llama.cpp's converter writes them, with the pure-Python BERT tokenizer of their
    vocabulary for the reference's token ids."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    root = tmp_path_factory.mktemp("encoders")
    vocab = tiny_encoders.wordpiece_vocab(root)
    embedder = tiny_encoders.build("bert", vocab, seed=11)
    reranker = tiny_encoders.build("roberta", vocab, seed=12, classifier="dense")
    return {"tokenizer": BertTokenizerLegacy(str(root / "vocab.txt"), do_lower_case=True),
            "embedder": (embedder, *tiny_encoders.write_gguf(embedder, root / "embedder.gguf", pooling="cls")),
            "reranker": (reranker, *tiny_encoders.write_gguf(reranker, root / "reranker.gguf"))}


@pytest.fixture(scope="module")
def embed_server(files):
    proc = ServerProcess("-m", str(files["embedder"][1]), "--embeddings", "-c", "256", "-np", "2")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def rerank_server(files):
    proc = ServerProcess("-m", str(files["reranker"][1]), "--reranking", "-c", "256", "-np", "1")
    yield proc
    proc.stop()


def test_embeddings_match_the_reference(embed_server, files):
    enc, _, weights = files["embedder"]
    tok = files["tokenizer"]
    body = post_ok(embed_server, "/v1/embeddings", {"input": TEXTS})
    ids = [tok(t)["input_ids"] for t in TEXTS]  # [CLS] ... [SEP]
    for d, i in zip(body["data"], ids):
        expected = ref.embedding("bert", weights, enc.config, i, "cls")
        assert float(np.array(d["embedding"]) @ expected) > 1 - 1e-3
    assert body["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    for same in ({"input": ids[0]}, {"input": {"prompt_string": TEXTS[0]}}, {"input": [TEXTS[0]]}):
        # the ids as given; the other text forms closed with [SEP] as a plain string is
        vector = post_ok(embed_server, "/v1/embeddings", same)["data"][0]["embedding"]
        np.testing.assert_allclose(vector, body["data"][0]["embedding"], atol=1e-6)
    raw = post_ok(embed_server, "/embedding", {"content": TEXTS[1], "embd_normalize": -1})[0]["embedding"]
    expected_row = ref.bert_hidden(weights, enc.config, ids[1])[0]  # the [CLS] row, not normalised
    assert len(raw) == 1 and np.allclose(raw[0], expected_row, atol=5e-3)


def test_rerank_matches_the_reference(rerank_server, files):
    enc, _, weights = files["reranker"]
    tok = files["tokenizer"]
    body = post_ok(rerank_server, "/rerank", {"query": QUERY, "documents": DOCS})
    prompts = [tok(QUERY, d)["input_ids"] for d in DOCS]  # [CLS] query [SEP] document [SEP]
    expected = [ref.classifier_score("roberta", weights, enc.config, p, True) for p in prompts]
    assert [r["index"] for r in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -expected[i])
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-3)
    assert body["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


@pytest.mark.parametrize("path, body", [("/completion", {"prompt": "hello", "n_predict": 4}),
                                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                                  "stream": True}),
                                        ("/v1/completions", {"prompt": "hello"})])
def test_completions_are_refused(embed_server, path, body):
    """An encoder has no LM head and no cache: every generating route answers 501 with llama-server's
    reason, and the server goes on embedding."""
    r = httpx.post(embed_server.url + path, json=body, timeout=60)
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["type"] == "not_supported_error" and "does not support logits computation" in err["message"]
    assert post_ok(embed_server, "/v1/embeddings", {"input": "still here"})["data"]


def test_an_input_past_the_position_table_is_refused(embed_server):
    """The learned position table has 128 rows: a longer input is llama-server's 400, not rows read past it."""
    r = httpx.post(embed_server.url + "/v1/embeddings", json={"input": "fox " * 200}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error", r.text
    r = httpx.post(embed_server.url + "/v1/embeddings", json={"input": " " * 20000 + "fox"}, timeout=60)
    assert r.status_code == 200, r.text  # whitespace makes no WordPiece tokens: no character-count shortcut


def test_an_encoder_without_embeddings_is_refused_at_load(files):
    """Without --embeddings / --reranking an encoder would answer no route: loading it is the error
    that ends the server, naming the flag (the startup decision itself, run in-process)."""
    from mlxcel.engine.errors import ModelLoadError
    from mlxcel.engine.model.loading import load_model
    from mlxcel.server.http.startup import load_into
    from mlxcel.server.http.state import ServerState
    from mlxcel.server.runtime.config import ServerConfig

    state = ServerState(ServerConfig())
    with pytest.raises(ModelLoadError, match=r"encoder-only \(bert\) model.*--embeddings"):
        load_into(state, loader=lambda: load_model(files["embedder"][1]))
    assert state.scheduler is None
