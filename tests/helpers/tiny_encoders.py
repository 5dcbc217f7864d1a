"""Tiny random BERT-family checkpoints in their Hugging Face tensor names, and the GGUF files
llama.cpp's convert_hf_to_gguf makes of them.

What the converter does for these models (``conversion/bert.py`` in the llama.cpp sources,
restated; nothing here is taken from its code):

- architecture ``bert`` for BertModel, RobertaModel, XLMRobertaModel and their sequence
  classifiers, ``nomic-bert`` for NomicBertModel, ``jina-bert-v2`` for JinaBertModel;
- the ``bert.`` / ``roberta.`` prefixes are dropped, and so are the pooler and the MLM heads; a
  classifier with labels has its lone ``classifier`` projection renamed ``classifier.out_proj``;
  a RoBERTa position table loses its first ``pad_token_id + 1`` rows (and the context as many);
- names go through gguf's ``TensorNameMap``; the hyperparameters are the common text-model ones
  with ``causal_attention = false``, the pooling type of a sentence-transformers model, the
  classifier's labels;
- a WordPiece vocabulary is stored with a "phantom space": ``##piece`` becomes ``piece`` and any
  other non-control ``piece`` becomes ``\u2581piece``; BOS is ``[CLS]``, EOS ``[SEP]``, with the
  add-BOS / add-EOS flags of ``[CLS] $A [SEP]`` and no separator flag (BERT's pair template).

``write_gguf`` also returns the *effective* weights: what the GGUF decodes to (quantized matrices
dequantized), in Hugging Face names, so a reference computed from them checks the loader exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, MODEL_ARCH, GGUFWriter, PoolingType, TensorNameMap, TokenType, quants
from gguf import GGMLQuantizationType as Q

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ARCHS = {"bert": MODEL_ARCH.BERT, "roberta": MODEL_ARCH.BERT, "nomic-bert": MODEL_ARCH.NOMIC_BERT,
         "jina-bert-v2": MODEL_ARCH.JINA_BERT_V2}
POOLING = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS, "last": PoolingType.LAST}


def wordpiece_vocab(out: Path, size: int = 420) -> list[str]:
    """A WordPiece vocabulary trained offline on ``tiny_checkpoints.CORPUS`` (BERT's specials first),
    written as ``vocab.txt`` in ``out`` for Hugging Face's own (slow, pure Python) BertTokenizer."""
    import tiny_checkpoints
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(tiny_checkpoints.CORPUS * 4, trainer=trainer)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return tokens


@dataclass
class TinyEncoder:
    kind: str  # "bert" | "roberta" (a RoBERTa sequence classifier) | "nomic-bert" | "jina-bert-v2"
    config: dict
    weights: dict[str, np.ndarray]  # Hugging Face names, float32
    vocab: list[str]
    labels: list[str] = field(default_factory=list)  # a sequence classifier's id2label

    @property
    def arch(self) -> str:
        return "bert" if self.kind == "roberta" else self.kind


def _rng_weights(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and name.endswith("weight"):  # the only vectors named weight are norms
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif "embeddings" in name:
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1]) * 1.5
        out[name] = w.astype(np.float32)
    return out


def build(kind: str, vocab: list[str], *, seed: int = 0, hidden: int = 64, heads: int = 4, layers: int = 2,
          ff: int = 128, positions: int = 128, classifier: str | None = None) -> TinyEncoder:
    """A random checkpoint of ``kind``; ``classifier``: ``"dense"`` (RoBERTa's dense + tanh +
    out_proj), ``"single"`` (BERT's or jina-reranker's lone ``classifier``)."""
    rng = np.random.default_rng(seed)
    v, h = len(vocab), hidden
    shapes: dict[str, tuple[int, ...]] = {"embeddings.word_embeddings.weight": (v, h),
                                          "embeddings.token_type_embeddings.weight": (2, h)}
    config = {"vocab_size": v, "type_vocab_size": 2}
    if kind in ("bert", "roberta", "jina-bert-v2"):
        config.update(hidden_size=h, num_attention_heads=heads, num_hidden_layers=layers, intermediate_size=ff,
                      layer_norm_eps=1e-12, hidden_act="gelu")
        shapes.update({"embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)})
        for i in range(layers):
            p = f"encoder.layer.{i}."
            for m in ("query", "key", "value"):
                shapes.update({f"{p}attention.self.{m}.weight": (h, h), f"{p}attention.self.{m}.bias": (h,)})
            shapes.update({f"{p}attention.output.dense.weight": (h, h), f"{p}attention.output.dense.bias": (h,),
                           f"{p}attention.output.LayerNorm.weight": (h,), f"{p}attention.output.LayerNorm.bias": (h,)})
            if kind == "jina-bert-v2":
                shapes.update({f"{p}mlp.gated_layers.weight": (2 * ff, h), f"{p}mlp.wo.weight": (h, ff),
                               f"{p}mlp.wo.bias": (h,), f"{p}mlp.layernorm.weight": (h,),
                               f"{p}mlp.layernorm.bias": (h,)})
            else:
                shapes.update({f"{p}intermediate.dense.weight": (ff, h), f"{p}intermediate.dense.bias": (ff,),
                               f"{p}output.dense.weight": (h, ff), f"{p}output.dense.bias": (h,),
                               f"{p}output.LayerNorm.weight": (h,), f"{p}output.LayerNorm.bias": (h,)})
        if kind != "jina-bert-v2":
            shapes.update({"embeddings.position_embeddings.weight": (positions, h),
                           "pooler.dense.weight": (h, h), "pooler.dense.bias": (h,)})  # the converter drops the pooler
            config["max_position_embeddings"] = positions
        else:
            config.update(max_position_embeddings=8192, position_embedding_type="alibi")
        if kind == "roberta":
            config.update(pad_token_id=1)
    else:  # nomic-bert, as nomic-embed-text's remote code names it
        config.update(n_embd=h, n_head=heads, n_layer=layers, n_inner=ff, layer_norm_epsilon=1e-12,
                      rotary_emb_base=1000, n_positions=positions, activation_function="swiglu")
        shapes.update({"emb_ln.weight": (h,), "emb_ln.bias": (h,)})
        for i in range(layers):
            p = f"encoder.layers.{i}."
            shapes.update({f"{p}attn.Wqkv.weight": (3 * h, h), f"{p}attn.out_proj.weight": (h, h),
                           f"{p}norm1.weight": (h,), f"{p}norm1.bias": (h,), f"{p}mlp.fc11.weight": (ff, h),
                           f"{p}mlp.fc12.weight": (ff, h), f"{p}mlp.fc2.weight": (h, ff), f"{p}norm2.weight": (h,),
                           f"{p}norm2.bias": (h,)})
    labels = []
    if classifier == "dense":
        shapes.update({"classifier.dense.weight": (h, h), "classifier.dense.bias": (h,),
                       "classifier.out_proj.weight": (1, h), "classifier.out_proj.bias": (1,)})
        labels = ["LABEL_0"]
    elif classifier == "single":
        shapes.update({"classifier.weight": (1, h), "classifier.bias": (1,)})
    weights = _rng_weights(rng, shapes)
    if kind == "roberta":  # a RoBERTa sequence classifier's encoder sits under "roberta."
        weights = {(k if k.startswith("classifier.") else f"roberta.{k}"): w for k, w in weights.items()}
    return TinyEncoder(kind, config, weights, vocab, labels)


def _phantom(token: str, control: bool) -> str:
    if control:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _converted(enc: TinyEncoder, split_gate: bool = False) -> list[tuple[str, str, np.ndarray]]:
    """(Hugging Face name, GGUF name, stored value) of every tensor the converter writes.
    ``split_gate``: a jina GLU's ``gated_layers`` as two tensors, gate rows then up rows (how
    jina-bert-v2 files were written before the converter kept ``ffn_up`` whole)."""
    cfg = enc.config
    names = TensorNameMap(ARCHS[enc.kind], cfg.get("num_hidden_layers") or cfg["n_layer"])
    out = []
    for hf, w in enc.weights.items():
        name = hf
        for prefix in ("bert.", "roberta."):
            name = name[len(prefix):] if name.startswith(prefix) else name
        if name.startswith("pooler.") or name == "embeddings.position_ids":
            continue
        if enc.labels and name in ("classifier.weight", "classifier.bias"):
            name = name.replace("classifier.", "classifier.out_proj.")
        if name == "embeddings.position_embeddings.weight" and cfg.get("pad_token_id") is not None:
            w = w[cfg["pad_token_id"] + 1:]
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for {name}")
        if split_gate and name.endswith("mlp.gated_layers.weight"):
            ff = w.shape[0] // 2
            out += [(hf, gguf_name.replace("ffn_up", "ffn_gate"), w[:ff]), (hf, gguf_name, w[ff:])]
            continue
        out.append((hf, gguf_name, w))
    return out


def _hparams(w: GGUFWriter, enc: TinyEncoder, pooling: str | None, causal: bool) -> None:
    cfg = enc.config
    n_ctx = cfg.get("max_position_embeddings") or cfg["n_positions"]
    if cfg.get("pad_token_id") is not None:
        n_ctx -= cfg["pad_token_id"] + 1
    w.add_block_count(cfg.get("num_hidden_layers") or cfg["n_layer"])
    w.add_context_length(n_ctx)
    w.add_embedding_length(cfg.get("hidden_size") or cfg["n_embd"])
    w.add_feed_forward_length(cfg.get("intermediate_size") or cfg["n_inner"])
    w.add_head_count(cfg.get("num_attention_heads") or cfg["n_head"])
    if "rotary_emb_base" in cfg:
        w.add_rope_freq_base(cfg["rotary_emb_base"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps") or cfg["layer_norm_epsilon"])
    w.add_file_type(0)
    w.add_causal_attention(causal)
    if pooling is not None:
        w.add_pooling_type(POOLING[pooling])
    if enc.labels:
        w.add_classifier_output_labels(enc.labels)


def _vocab(w: GGUFWriter, enc: TinyEncoder, model: str) -> None:
    ids = {t: i for i, t in enumerate(enc.vocab)}
    control = [t in SPECIALS for t in enc.vocab]
    w.add_token_type_count(enc.config["type_vocab_size"])
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre("default")
    w.add_token_list([_phantom(t, c) for t, c in zip(enc.vocab, control)])
    w.add_token_types([TokenType.CONTROL if c else TokenType.NORMAL for c in control])
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", ids["[CLS]"])  # (this gguf package has no writer method)
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)


def write_gguf(enc: TinyEncoder, out: Path, *, qtype: Q = Q.F32, pooling: str | None = None,
               architecture: str | None = None, split_gate: bool = False, drop: tuple[str, ...] = (),
               extra: dict[str, np.ndarray] | None = None, causal: bool = False,
               tokenizer_model: str = "bert") -> tuple[Path, dict[str, np.ndarray]]:
    """``enc`` as the converter writes it (matrices of whole blocks stored as ``qtype``), and the
    effective weights in Hugging Face names. For the refusals: ``architecture`` and
    ``tokenizer_model`` override what is written, ``drop`` leaves tensors out, ``extra`` adds some,
    ``causal`` marks the attention causal. ``split_gate`` as :func:`_converted`."""
    w = GGUFWriter(str(out), architecture or enc.arch)
    w.add_string("general.name", f"tiny-{enc.kind}")
    _hparams(w, enc, pooling, causal)
    _vocab(w, enc, tokenizer_model)
    parts: dict[str, list[np.ndarray]] = {}
    for hf, name, value in _converted(enc, split_gate):
        if name in drop:
            continue
        t = qtype if value.ndim == 2 and value.shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0 else Q.F32
        data = value.astype(np.float16) if t == Q.F16 else value if t == Q.F32 else quants.quantize(value, t)
        w.add_tensor(name, data, raw_dtype=None if t in (Q.F32, Q.F16) else t)
        parts.setdefault(hf, []).append(
            data.astype(np.float32) if t in (Q.F32, Q.F16) else quants.dequantize(data, t).astype(np.float32))
    effective = dict(enc.weights)
    for hf, decoded in parts.items():
        value = np.concatenate(decoded) if len(decoded) > 1 else decoded[0]
        if value.shape != enc.weights[hf].shape:  # a RoBERTa position table keeps its unused first rows
            value = np.concatenate([enc.weights[hf][:enc.weights[hf].shape[0] - value.shape[0]], value])
        effective[hf] = value
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out, effective
