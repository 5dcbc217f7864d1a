"""Encoder-only (BERT-family) checkpoints, recognised so they are refused with a clear message.

mlxcel serves decoder models through mlx-lm, which has no encoder models. The maintained MLX
package for them, ``mlx-embeddings``, was weighed and left out: it depends on ``mlx-vlm`` (and
through it ``opencv-python``, ``datasets``, ``mlx-audio``), and it loads Hugging Face directories
only, never a GGUF file, which is how llama-server users hold their BERT embedders.
"""

from __future__ import annotations

from mlxcel.engine.errors import ModelLoadError

# Hugging Face model_type values and GGUF general.architecture values of encoder-only models
HF_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "modernbert", "electra",
                      "deberta", "deberta-v2", "mpnet", "camembert", "jina_bert", "new", "eurobert", "neobert"})
GGUF_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                        "neo-bert", "eurobert", "t5encoder"})


def refuse_encoder_only(kind: str | None, source: str, *, gguf: bool) -> None:
    """Raise ``ModelLoadError`` when ``kind`` (model_type or GGUF architecture) is encoder-only."""
    if kind and kind.lower() in (GGUF_ARCHS if gguf else HF_TYPES):
        raise ModelLoadError(
            f"{source} is an encoder-only ({kind}) model; mlxcel serves decoder models (mlx-lm's model zoo), "
            "so BERT-family embedders and rerankers are not supported. For --embeddings use a decoder "
            "checkpoint (e.g. a Qwen3-Embedding model); for --reranking a GGUF reranker with a rank head or a "
            "Qwen3-Reranker")
