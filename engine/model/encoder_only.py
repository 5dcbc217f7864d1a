"""Encoder-only (BERT-family) checkpoints: which ones mlxcel runs, and a clear refusal for the rest.

mlxcel serves decoder models through mlx-lm, which has no encoder models, and runs the BERT-family
GGUF files llama-server users embed and rerank with (``bert``, ``nomic-bert``, ``jina-bert-v2``)
on its own encoder (``engine.model.encoder``). The maintained MLX package for encoders,
``mlx-embeddings``, was weighed and left out: it depends on ``mlx-vlm`` (and through it
``opencv-python``, ``datasets``, ``mlx-audio``), and it reads Hugging Face directories only, never
a GGUF file. So an encoder is served from its GGUF; a Hugging Face encoder directory is refused
with the way to get one, and the GGUF encoder architectures not implemented are refused naming
what they lack.
"""

from __future__ import annotations

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.architectures.bert import NOT_SERVED, SERVED

# Hugging Face model_type values and GGUF general.architecture values of encoder-only models
HF_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "modernbert", "electra",
                      "deberta", "deberta-v2", "mpnet", "camembert", "jina_bert", "new", "eurobert", "neobert"})
GGUF_ARCHS = frozenset(SERVED) | frozenset(NOT_SERVED)


def is_served_encoder(arch: str | None) -> bool:
    """Whether a GGUF ``general.architecture`` is one of the encoders mlxcel runs."""
    return arch in SERVED


def refuse_encoder_only(kind: str | None, source: str, *, gguf: bool) -> None:
    """Raise ``ModelLoadError`` when ``kind`` (model_type or GGUF architecture) is an encoder-only
    model mlxcel does not run from this form: any Hugging Face encoder directory, and the GGUF
    encoder architectures outside ``SERVED``."""
    if not kind:
        return
    kind = kind.lower()
    if gguf and kind in NOT_SERVED:
        raise ModelLoadError(
            f"{source} is an encoder-only ({kind}) model that mlxcel cannot run: {NOT_SERVED[kind]}. mlxcel runs "
            f"the {', '.join(SERVED)} GGUF encoders (bge, e5, MiniLM, nomic-embed-text, jina-embeddings-v2)")
    if not gguf and kind in HF_TYPES:
        raise ModelLoadError(
            f"{source} is an encoder-only ({kind}) model directory; mlxcel runs BERT-family embedders and "
            f"rerankers from their GGUF files ({', '.join(SERVED)}), as llama-server does: convert it with "
            "llama.cpp's convert_hf_to_gguf.py, or use a GGUF release of the model")
