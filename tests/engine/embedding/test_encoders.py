"""BERT-family GGUF encoders (``bert``, ``nomic-bert``, ``jina-bert-v2``) against an independent
float reference: tiny random checkpoints in Hugging Face names, written as llama.cpp's converter
writes them (``tiny_encoders``), loaded by mlxcel, and compared with a numpy implementation of each
Hugging Face model (``encoder_reference``), itself checked against transformers where torch is
installed. The WordPiece tokenizer rebuilt from the GGUF vocabulary is checked against Hugging
Face's pure-Python BERT tokenizer."""

from __future__ import annotations

import json

import encoder_reference as ref
import mlx.core as mx
import numpy as np
import pytest
import tiny_encoders
from gguf import GGMLQuantizationType as Q

from mlxcel.engine.embedding.pooling import embed, hidden_states
from mlxcel.engine.embedding.rank_head import gguf_rank_head
from mlxcel.engine.errors import MlxcelError, ModelLoadError
from mlxcel.engine.model.encoder import network
from mlxcel.engine.model.loading import load_model
from mlxcel.engine.platform import device

TEXTS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b",
         "Hello, WORLD! How are you today?", "Once upon a time there was a little robot who loved to count."]
# (kind, build options): RoBERTa's position offset; jina with six heads (ALiBi's rule for a count
# that is not a power of two)
FAMILIES = {"bert": {}, "roberta": {"classifier": "dense"}, "nomic-bert": {},
            "jina-bert-v2": {"hidden": 96, "heads": 6}}


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wordpiece")
    return root, tiny_encoders.wordpiece_vocab(root)


@pytest.fixture(scope="module")
def bert_tokenizer(vocab_dir):
    """Hugging Face's pure-Python BERT tokenizer (not the ``tokenizers`` library mlxcel builds on)."""
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    return BertTokenizerLegacy(str(vocab_dir[0] / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def families(vocab_dir, tmp_path_factory):
    """``get(kind, qtype)``: (checkpoint, the weights its GGUF decodes to, the loaded model, qtype),
    each built once."""
    built = {}

    def get(kind: str, qtype: Q):
        if (kind, qtype) not in built:
            enc = tiny_encoders.build(kind, vocab_dir[1], seed=3, **FAMILIES[kind])
            path, effective = tiny_encoders.write_gguf(enc, tmp_path_factory.mktemp(kind) / f"{kind}.gguf",
                                                       qtype=qtype, pooling="mean")
            built[kind, qtype] = enc, effective, load_model(path), qtype
        return built[kind, qtype]

    return get


@pytest.fixture(params=[(k, q) for k in FAMILIES for q in (Q.F32, Q.Q8_0)], ids=lambda p: f"{p[0]}-{p[1].name}")
def family(request, families):
    return families(*request.param)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_hidden_states_and_poolings_match_the_reference(family, bert_tokenizer):
    """Every token's output, the mean and CLS poolings, through the loaded GGUF (float and Q8_0 on the
    packed CPU kernels) against the float64 reference on the weights the file decodes to: within 1e-5
    cosine for a float file; within 3e-3 for Q8_0, whose kernels quantize the activations too, as
    llama.cpp's Q8_0 dot products do (the same file with its weights dequantized is within 1e-6)."""
    enc, effective, loaded, qtype = family
    tolerance = 1e-5 if qtype == Q.F32 and device.compute_dtype() == mx.float32 else 3e-3
    for text in TEXTS:
        ids = bert_tokenizer(text)["input_ids"]
        expected = ref.HIDDEN[enc.kind](effective, enc.config, ids)
        ours = np.array(hidden_states(loaded.model, ids))
        assert ours.shape == expected.shape
        assert min(cosine(o, e) for o, e in zip(ours, expected)) > 1 - tolerance
        for pooling in ("mean", "cls"):
            v = embed(loaded.model, ids, pooling)
            assert abs(np.linalg.norm(v) - 1) < 1e-5
            assert cosine(v, ref.embedding(enc.kind, effective, enc.config, ids, pooling)) > 1 - tolerance
    assert loaded.metadata["encoder"] and loaded.metadata["pooling_type"] == 1  # mean, as the file says


def test_rank_head_reads_the_first_token(families, bert_tokenizer):
    """A RoBERTa classification head (dense + tanh + out_proj) scores the [CLS] row, as llama.cpp's
    rank pooling does for a bidirectional model (the float file: Q8_0 activations move a logit by
    about 1e-2)."""
    enc, effective, loaded, _ = families("roberta", Q.F32)
    head = gguf_rank_head(loaded.metadata["classifier_tensors"], "bert")
    assert head.dense is not None and head.output is not None
    ids = bert_tokenizer("what is the capital", "the capital of France is Paris")["input_ids"]
    score = float(embed(loaded.model, ids, "rank", normalization=-1, head=head)[0])
    assert score == pytest.approx(ref.classifier_score("roberta", effective, enc.config, ids, True), abs=1e-3)


def test_the_wordpiece_tokenizer_is_berts(families, bert_tokenizer):
    """The GGUF's phantom-space vocabulary spelled back as WordPiece splits as BERT does: lowercase,
    accents stripped, punctuation and CJK characters alone, unknown words [UNK], [CLS] ... [SEP]."""
    _, _, loaded, _ = families("bert", Q.F32)
    tok = loaded.tokenizer._tokenizer
    bert_tokenizer.wordpiece_tokenizer.max_input_chars_per_word = 1 << 20  # llama.cpp has no word-length limit
    for text in TEXTS + ["Café déjà vu, naïve façade", "東京 and 北京!", "x" * 300, "  spaced\tout\n\nlines  ",
                         "supercalifragilisticexpialidocious", "[CLS] inside text [SEP]", ""]:
        assert tok.encode(text, add_special_tokens=True) == bert_tokenizer(text)["input_ids"], text
    assert loaded.metadata["add_bos"] and loaded.bos_token_id == bert_tokenizer.cls_token_id


def test_the_reference_is_transformers(vocab_dir):
    """The numpy reference computes what transformers' own BertModel and RobertaForSequenceClassification
    compute on the same weights (positions given explicitly: RoBERTa's own numbering skips padding
    tokens, and llama.cpp never pads)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = [2, 40, 41, 42, 43, 44, 3]
    for kind in ("bert", "roberta"):
        enc = tiny_encoders.build(kind, vocab_dir[1], seed=5, **FAMILIES[kind])
        cfg = dict(enc.config, num_labels=1)
        if kind == "bert":
            model = transformers.BertModel(transformers.BertConfig(**cfg))
        else:
            model = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(**cfg))
        missing, _ = model.load_state_dict({k: torch.tensor(v) for k, v in enc.weights.items()}, strict=False)
        assert not [m for m in missing if not m.endswith("position_ids")], missing
        model.eval()
        offset = cfg.get("pad_token_id", -1) + 1
        with torch.no_grad():
            out = model(torch.tensor([ids]), position_ids=torch.arange(offset, offset + len(ids))[None])
        if kind == "bert":
            np.testing.assert_allclose(out.last_hidden_state[0].numpy(), ref.bert_hidden(enc.weights, cfg, ids),
                                       atol=1e-4)
        else:
            assert float(out.logits[0, 0]) == pytest.approx(
                ref.classifier_score(kind, enc.weights, cfg, ids, True), abs=1e-4)


def test_jina_gate_as_its_own_tensor(vocab_dir, tmp_path, bert_tokenizer):
    """Older jina-bert-v2 files carry the GLU's gate as ``ffn_gate`` beside a half-height ``ffn_up``
    (llama.cpp runs both layouts); the same model either way. A jina reranker's lone ``cls.weight``
    is scored through the tanh llama.cpp applies."""
    enc = tiny_encoders.build("jina-bert-v2", vocab_dir[1], seed=4, classifier="single")
    split, effective = tiny_encoders.write_gguf(enc, tmp_path / "split.gguf", split_gate=True)
    fused, _ = tiny_encoders.write_gguf(enc, tmp_path / "fused.gguf")
    a, b = load_model(split), load_model(fused)
    assert "ffn_gate" in a.model.blk[0] and "ffn_gate" not in b.model.blk[0]
    ids = bert_tokenizer(TEXTS[0])["input_ids"]
    np.testing.assert_allclose(np.array(hidden_states(a.model, ids)), np.array(hidden_states(b.model, ids)),
                               atol=1e-4)
    head = gguf_rank_head(a.metadata["classifier_tensors"], "jina-bert-v2")
    assert head.output is None and head.dense is not None
    score = float(embed(a.model, ids, "rank", normalization=-1, head=head)[0])
    # (1e-3: llama.cpp's GELU is the tanh form, the reference's the exact one)
    assert score == pytest.approx(ref.classifier_score("jina-bert-v2", effective, enc.config, ids, False), abs=1e-3)


def test_long_inputs_attend_in_blocks(vocab_dir, tmp_path, monkeypatch):
    """A long input's attention goes a block of queries at a time (so an 8192-token jina input never
    holds every score at once): the same output as in one piece, ALiBi's distances included; and an
    input past a learned position table is an error, never rows read from beyond it."""
    enc = tiny_encoders.build("jina-bert-v2", vocab_dir[1], seed=6)
    loaded = load_model(tiny_encoders.write_gguf(enc, tmp_path / "jina.gguf")[0])
    ids = [int(i) for i in np.random.default_rng(0).integers(5, len(vocab_dir[1]), size=300)]
    whole = np.array(hidden_states(loaded.model, ids))
    monkeypatch.setattr(network, "SCORE_BUDGET", 4 * 300 * 7)  # blocks of 7 queries
    np.testing.assert_allclose(np.array(hidden_states(loaded.model, ids)), whole, atol=1e-5)
    expected = ref.jina_hidden(enc.weights, enc.config, ids)
    assert min(cosine(o, e) for o, e in zip(whole, expected)) > 1 - (1e-5 if device.compute_dtype() == mx.float32 else 3e-3)
    bert = load_model(tiny_encoders.write_gguf(tiny_encoders.build("bert", vocab_dir[1]), tmp_path / "b.gguf")[0])
    assert bert.context_length == 128
    with pytest.raises(ValueError, match="positions"):
        hidden_states(bert.model, [5] * 129)


def test_an_encoder_has_no_cache_to_generate_with(families):
    """A decoder's cache asked of an encoder (``mlxcel generate``, a slot restore) is one clear error,
    an ``MlxcelError`` the CLI prints as the reason, not a failure deep in the cache code."""
    _, _, loaded, _ = families("nomic-bert", Q.F32)
    with pytest.raises(MlxcelError, match=r"encoder-only \(nomic-bert\) model.*--embeddings"):
        loaded.make_cache()


@pytest.mark.parametrize("case, options, match", [
    ("moe", {"architecture": "nomic-bert-moe"}, "mixture-of-experts"),
    ("jina-v3", {"architecture": "jina-bert-v3"}, "LoRA adapters"),
    ("t5", {"tokenizer_model": "t5"}, "SentencePiece Unigram"),
    ("missing", {"drop": ("blk.0.attn_output_norm.bias", "blk.1.attn_output_norm.bias")}, "attn_output_norm.bias"),
    ("uneven", {"drop": ("blk.1.attn_q.bias",)}, "block 1 has tensors"),
    ("extra", {"extra": {f"blk.{i}.ffn_gate_inp.weight": np.zeros((4, 64), np.float32) for i in (0, 1)}},
     "does not use: ffn_gate_inp.weight"),
    ("causal", {"causal": True}, "causal attention")])
def test_refusals_name_what_is_wrong(vocab_dir, tmp_path, case, options, match):
    """A file mlxcel cannot run right is refused at load, naming why (never a model that runs wrong)."""
    path, _ = tiny_encoders.write_gguf(tiny_encoders.build("bert", vocab_dir[1]), tmp_path / f"{case}.gguf", **options)
    with pytest.raises(ModelLoadError, match=match):
        load_model(path)


def test_encoder_directories_are_refused_with_the_way_to_a_gguf(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelLoadError, match="convert_hf_to_gguf"):
        load_model(tmp_path)


def test_alibi_slopes_are_the_papers():
    for n in (4, 6, 8, 12, 16):
        np.testing.assert_allclose(np.array(network.alibi_slopes(n, 8.0)), ref.alibi_slopes(n), rtol=1e-6)
    assert mx.allclose(network.alibi_slopes(2, 8.0), mx.array([1 / 16, 1 / 256]))
