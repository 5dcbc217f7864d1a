"""Embeddings and rerank on real servers over tiny checkpoints: embeddings against an independent
mlx-lm forward (cosine of a text with itself 1.0, shapes, upstream's normalisations, base64 round
trip, the OpenAI client), and rerank on a GGUF whose rank head was built so the order is known."""

from __future__ import annotations

import base64
import functools
import struct
import threading
import time

import httpx
import mlx.core as mx
import numpy as np
import pytest
import tiny_gguf
from gguf import GGMLQuantizationType as Q
from server_process import ServerProcess, load_capture, post_ok
from tokenizers import Tokenizer

TEXT = "The quick brown fox jumps over the lazy dog."
QUERY = "What is the capital of France?"
DOCS = ["The capital of Italy is Rome.", "Hello, world! How are you today?", "The capital of France is Paris.",
        "def add(a, b):\n    return a + b\n"]
KNOWN_TOP = 2  # the head is this document's own hidden state: its score is the largest


@pytest.fixture(scope="module")
def embed_server(tiny_llama_dir):
    proc = ServerProcess("-m", str(tiny_llama_dir), "--embeddings", "--pooling", "last", "-c", "512", "-np", "2")
    yield proc
    proc.stop()


@functools.cache
def reference_model(model_dir):
    from mlx_lm import load

    return load(str(model_dir))[0]


def reference_hidden(model_dir, tokens: list[int]) -> np.ndarray:
    """The final-norm output of the last token, from mlx-lm's own model (no mlxcel code)."""
    return np.array(reference_model(model_dir).model(mx.array([tokens]))[0, -1])


def oai(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)


def test_embedding_matches_the_model_and_is_normalised(embed_server, tiny_llama_dir):
    body = post_ok(embed_server, "/v1/embeddings", {"input": [TEXT, TEXT, "Hello, world!"]})
    data = body["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and all(d["object"] == "embedding" for d in data)
    vectors = [np.array(d["embedding"]) for d in data]
    assert all(v.shape == (64,) for v in vectors)  # the tiny model's hidden size
    for v in vectors:
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5
    assert float(vectors[0] @ vectors[1]) == pytest.approx(1.0, abs=1e-6)  # cosine of a text with itself
    assert float(vectors[0] @ vectors[2]) < 0.999
    tokens = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json")).encode(TEXT, add_special_tokens=False).ids
    expected = reference_hidden(tiny_llama_dir, tokens)
    np.testing.assert_allclose(vectors[0], expected / np.linalg.norm(expected), rtol=1e-4, atol=1e-5)
    hello = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json")).encode("Hello, world!",
                                                                               add_special_tokens=False).ids
    n = 2 * len(tokens) + len(hello)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    raw = np.array(post_ok(embed_server, "/v1/embeddings", {"input": TEXT, "embd_normalize": -1})["data"][0]["embedding"])
    np.testing.assert_allclose(raw, expected, rtol=1e-4, atol=1e-4)
    taxicab = np.array(post_ok(embed_server, "/v1/embeddings", {"input": TEXT, "embd_normalize": 1})["data"][0]
                       ["embedding"])
    assert np.abs(taxicab).sum() == pytest.approx(1.0, rel=1e-5)
    maxabs = np.array(post_ok(embed_server, "/v1/embeddings", {"input": TEXT, "embd_normalize": 0})["data"][0]
                      ["embedding"])
    assert np.abs(maxabs).max() == pytest.approx(32760.0, rel=1e-5)


def test_base64_round_trip_and_input_forms(embed_server):
    floats = post_ok(embed_server, "/v1/embeddings", {"input": TEXT})["data"][0]["embedding"]
    enc = post_ok(embed_server, "/v1/embeddings", {"input": TEXT, "encoding_format": "base64"})["data"][0]
    assert enc["encoding_format"] == "base64"
    raw = base64.b64decode(enc["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert list(decoded) == pytest.approx(floats, abs=1e-7)
    parts = post_ok(embed_server, "/v1/embeddings", {"input": [
        "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
        {"prompt_string": "hello world"}]})["data"]
    assert parts[0]["embedding"] == parts[1]["embedding"] == parts[2]["embedding"]
    ids = httpx.post(embed_server.url + "/tokenize", json={"content": "hello world"}).json()["tokens"]
    assert post_ok(embed_server, "/v1/embeddings", {"input": ids})["data"][0]["embedding"] == parts[0]["embedding"]


def test_native_shape_and_openai_client(embed_server):
    native = post_ok(embed_server, "/embedding", {"content": TEXT})
    assert len(native) == 1 and native[0]["index"] == 0
    assert len(native[0]["embedding"]) == 1 and len(native[0]["embedding"][0]) == 64  # one pooled row
    from openai import OpenAI

    client = OpenAI(api_key="none", base_url=embed_server.url + "/v1")
    res = client.embeddings.create(model="any", input=[TEXT, "Hello"])
    assert len(res.data) == 2 and len(res.data[0].embedding) == 64


@pytest.mark.parametrize("body", [{"input": []}, {"input": True}, {"input": "hello", "encoding_format": 1},
                                  {"input": {"content": "string"}}, {"input": {"content": [{"type": "unknown"}]}},
                                  {"input": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}},
                                  {"nothing": 1}, {"input": "a", "embd_normalize": "x"}])
def test_bad_embedding_requests(embed_server, body):
    r = oai(embed_server, **body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_a_long_embedding_request_yields_to_completions_and_stops_when_its_client_leaves(embed_server):
    """Thousands of inputs run a slice at a time between the engine's steps (a completion is
    answered meanwhile, not queued behind them or refused as a full queue), and when the client
    hangs up the engine drops the inputs left instead of computing them for nobody."""
    inputs = [[5 + (i + j) % 300 for j in range(200)] for i in range(5000)]  # many seconds of engine work

    def leave_after_3_s():
        with pytest.raises(httpx.TimeoutException):
            httpx.post(embed_server.url + "/embedding", json={"content": inputs}, timeout=3)

    client = threading.Thread(target=leave_after_3_s)
    client.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    r = httpx.post(embed_server.url + "/completion", json={"prompt": "hi", "n_predict": 1}, timeout=60)
    waited = time.monotonic() - t0
    client.join(60)
    assert r.status_code == 200, r.text[:300]
    assert waited < 10, f"the completion waited {waited:.1f} s behind the embedding"
    deadline = time.monotonic() + 20
    while "embedding request dropped after" not in embed_server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = embed_server.log()
    assert "embedding request dropped after" in log, log[-2000:]
    line = log[log.index("embedding request dropped after"):].splitlines()[0]
    done = int(line.split("after ")[1].split(" of ")[0])
    assert done < 5000 and "of 5000 inputs" in line, line


def test_too_long_and_rerank_off(embed_server):
    r = oai(embed_server, input="The quick brown fox " * 300)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    r = httpx.post(embed_server.url + "/rerank", json={"query": "a", "documents": ["b"]})
    assert r.status_code == 501 and r.json() == load_capture("err_rerank_disabled").json()


# -- rerank ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reranker(tiny_llama_dir, tmp_path_factory):
    """A GGUF of the tiny llama with a one-output rank head equal to document 2's own hidden state."""
    root = tmp_path_factory.mktemp("reranker")
    tok = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))

    def enc(text):
        return tok.encode(text, add_special_tokens=False).ids

    prompts = [enc(QUERY) + enc(d) for d in DOCS]  # no BOS/EOS/SEP in this vocabulary: query then document
    hidden = [reference_hidden(tiny_llama_dir, p) for p in prompts]
    head = hidden[KNOWN_TOP][None, :].astype(np.float32)
    path = tiny_gguf.write_gguf(tiny_llama_dir, root / "reranker.gguf",
                                extra_tensors={"cls.output.weight": (head, Q.F32)},
                                extra_metadata={"llama.pooling_type": 4})
    proc = ServerProcess("-m", str(path), "--reranking", "-c", "512", "-np", "1")
    yield proc, [float(head[0] @ h) for h in hidden], [len(p) for p in prompts]
    proc.stop()


def test_rerank_order_and_scores(reranker):
    server, scores, lengths = reranker
    body = post_ok(server, "/rerank", {"query": QUERY, "documents": DOCS})
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert order[0] == KNOWN_TOP
    assert [r["index"] for r in body["results"]] == order
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(scores[r["index"]], rel=1e-3)
    assert body["usage"] == {"prompt_tokens": sum(lengths), "total_tokens": sum(lengths)}
    assert body["object"] == "list"
    top = post_ok(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})["results"]
    assert [r["index"] for r in top] == order[:2]
    tei = post_ok(server, "/reranking", {"query": QUERY, "texts": DOCS, "return_text": True})
    assert [r["index"] for r in tei] == order and tei[0]["text"] == DOCS[KNOWN_TOP] and "score" in tei[0]


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3]])
def test_bad_rerank_requests(reranker, documents):
    r = httpx.post(reranker[0].url + "/v1/reranking", json={"query": QUERY, "documents": documents})
    assert r.status_code == 400, r.text
    r = httpx.post(reranker[0].url + "/rerank", json={"documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["message"] == '"query" must be provided'


def test_reranking_without_a_rank_head_scores_as_upstream(tiny_llama, caplog):
    """No rank head: llama.cpp's rank pooling leaves the last token's normed hidden state, and
    llama-server's score is its first component; the same here, with a warning at startup."""
    from mlxcel.engine.embedding.pooling import embed
    from mlxcel.server.runtime.config import ServerConfig
    from mlxcel.server.runtime.embedder import Embedder

    with caplog.at_level("WARNING"):
        embedder = Embedder.load(ServerConfig(reranking=True), tiny_llama)
    assert embedder.head is None and "no rank head" in caplog.text
    tokens = tiny_llama.tokenizer.encode("a query and a document")
    last = embed(tiny_llama.model, tokens, "last", normalization=-1)
    assert embedder.score(tokens) == float(last[0]) and float(last[0]) != float(last[1])
    assert Embedder.load(ServerConfig(embeddings=True), tiny_llama).pooling == "none"  # the model names none


def test_a_qwen3_reranker_directory_scores_with_its_yes_no_rows(tmp_path):
    """A Qwen3-Reranker checkpoint (recognised by its model card) ranks with the softmax of its LM
    head's "yes" and "no" rows over the last hidden state, on the model card's prompt."""
    import json

    import tiny_checkpoints
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    from mlxcel.engine.model.loading import load_model
    from mlxcel.server.runtime.config import ServerConfig
    from mlxcel.server.runtime.embedder import Embedder

    out = tmp_path / "tiny-reranker"
    vocab = tiny_checkpoints.build_tokenizer(out, extra_special=("yes", "no"))
    config = tiny_checkpoints.tiny_config("qwen2", vocab)
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=False)
    mx.random.seed(7)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config))
    (out / "README.md").write_text("# Qwen3-Reranker-0.6B\n\nA tiny stand-in.\n")
    loaded = load_model(out)
    embedder = Embedder.load(ServerConfig(reranking=True), loaded)
    assert "{query}" in embedder.rerank_template and "{document}" in embedder.rerank_template
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab()
    tokens = Tokenizer.from_file(str(out / "tokenizer.json")).encode("The capital of France is Paris.").ids
    hidden = np.array(loaded.model.model(mx.array([tokens]))[0, -1])
    w = np.array(loaded.model.lm_head.weight)
    logits = np.array([w[ids["yes"]] @ hidden, w[ids["no"]] @ hidden])
    expected = np.exp(logits[0]) / np.exp(logits).sum()
    assert embedder.score(tokens) == pytest.approx(float(expected), rel=1e-4)
