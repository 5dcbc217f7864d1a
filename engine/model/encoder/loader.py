"""A BERT-family GGUF file (``bert``, ``nomic-bert``, ``jina-bert-v2``) as a :class:`LoadedModel`
holding mlxcel's encoder: its shape from the metadata (``gguf.architectures.bert``), its tokenizer
rebuilt from the vocabulary (WordPiece for ``bert`` vocabularies, byte-level BPE for the jina
code and bilingual models), and the metadata the embedding and rerank routes read (pooling type,
special-token layout, the classifier head).

XLM-RoBERTa-based files (bge-m3, bge-reranker-v2-m3, multilingual-e5) carry a SentencePiece
Unigram vocabulary (``tokenizer.ggml.model = "t5"``), which mlxcel does not rebuild: such a file
is refused with that reason before its weights are read.
"""

from __future__ import annotations

import logging
from pathlib import Path

from mlx.utils import tree_flatten

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures.bert import encoder_spec
from mlxcel.engine.gguf.file import GGUFFile
from mlxcel.engine.gguf.tokenizer import build_tokenizer
from mlxcel.engine.model.encoder.network import Encoder
from mlxcel.engine.model.encoder.weights import classifier_tensors, install_weights
from mlxcel.engine.model.loaded_model import LoadedModel

log = logging.getLogger(__name__)

VOCABULARIES = ("bert", "gpt2")  # WordPiece; byte-level BPE (jina-v2-code, jina-v2-es/de)


def load_encoder_gguf(path: Path, gguf_file: GGUFFile) -> LoadedModel:
    """The encoder in ``gguf_file`` (already parsed from ``path``), ready to embed."""
    meta = gguf_file.metadata
    source = str(path)
    vocab = meta.get("tokenizer.ggml.model")
    if vocab not in VOCABULARIES:
        raise ModelLoadError(
            f"{source}: its {meta.get('general.architecture')} encoder uses a {vocab!r} vocabulary"
            + (" (XLM-RoBERTa's SentencePiece Unigram: bge-m3, bge-reranker-v2-m3, multilingual-e5)"
               if vocab == "t5" else "")
            + ", which mlxcel does not rebuild; mlxcel serves BERT-family files with WordPiece ('bert') or "
              "byte-level BPE ('gpt2') vocabularies")
    spec = encoder_spec(meta, {name: info.shape for name, info in gguf_file.tensors.items()}, source)
    tokenizer, ids = build_tokenizer(meta, source)
    model = Encoder(spec)
    install_weights(model, gguf_file)
    arch = spec.arch
    resident = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    log.info("%s: %s encoder, %d layers, hidden %d, weights resident: %.1f MiB", path.name, arch, spec.n_layer,
             spec.hidden, resident / 2**20)
    config = {"model_type": arch, "vocab_size": spec.vocab_size, "hidden_size": spec.hidden,
              "num_hidden_layers": spec.n_layer, "num_attention_heads": spec.n_head,
              "num_key_value_heads": spec.n_head, "intermediate_size": spec.n_ff,
              "max_position_embeddings": spec.n_ctx_train, "bos_token_id": ids.bos, "eos_token_id": ids.eos}
    return LoadedModel(
        model=model, tokenizer=tokenizer, config=config, path=path, source="gguf",
        name=str(meta.get("general.name") or path.name), chat_template=meta.get("tokenizer.chat_template"),
        metadata={
            "encoder": True,  # no KV cache and no text generation: embeddings and rerank only
            "add_bos": ids.add_bos,
            "add_eos": ids.add_eos,
            "architecture": arch,
            "file_type": meta.get("general.file_type"),
            "tensor_types": _type_counts(gguf_file),
            "tokenizer_model": vocab,
            "sep_token_id": ids.sep,
            "tokenizer_pre": meta.get("tokenizer.ggml.pre"),
            "weight_bytes": resident,
            "token_ids": {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.") and k.endswith("_id")},
            "pooling_type": meta.get(f"{arch}.pooling_type"),
            "rerank_template": meta.get("tokenizer.chat_template.rerank"),
            "add_sep": bool(meta.get("tokenizer.ggml.add_sep_token", _adds_sep(meta))),
            "classifier_tensors": classifier_tensors(gguf_file),
        },
    )


def _adds_sep(meta: dict) -> bool:
    """llama.cpp's default for a file that does not say: a WordPiece vocabulary puts a separator
    between a rerank query and its document, as do the jina and RoBERTa BPE pre-tokenizers."""
    return meta.get("tokenizer.ggml.model") == "bert" or meta.get("tokenizer.ggml.pre") in (
        "jina-v1-en", "jina-v2-code", "roberta-bpe")


def _type_counts(gguf_file: GGUFFile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for info in gguf_file.tensors.values():
        counts[info.type_name] = counts.get(info.type_name, 0) + 1
    return counts
