"""Rank (classifier) heads: what turns a reranker's last hidden state into a relevance score.

Two sources, the ones llama-server users meet:

* a GGUF file's ``cls.*`` tensors, as llama.cpp's converters write them: an optional dense layer
  ``cls.weight`` / ``cls.bias`` followed by tanh (the RoBERTa / XLM-RoBERTa classification head:
  bge-reranker), then an optional output projection ``cls.output.weight`` / ``cls.output.bias``
  (BERT's sequence-classification layer alone is stored as that projection). A file with the dense
  layer only (jina-reranker-v1) is scored as llama.cpp scores it, through the tanh. A Qwen3
  reranker's output rows are the LM head's "yes" and "no" rows, and its two outputs go through a
  softmax;
* a Qwen3-Reranker checkpoint directory (a causal LM its model card or name calls a reranker):
  the same two rows, taken from its LM head (or tied embedding).

The score is the first output (for a Qwen3 reranker, the probability of "yes"). The head reads
one row of the hidden states: the last token's for a decoder, the first (``[CLS]``) for a
bidirectional encoder, as llama.cpp's rank pooling picks it (``pooling.summary_row``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

# the prompt Qwen3 rerankers expect ({query} and {document} filled in), as their model card gives it
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
    "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


@dataclass
class RankHead:
    output: mx.array | None  # [n_out, H]; None: the dense layer's tanh outputs are the scores
    output_bias: mx.array | None = None
    dense: mx.array | None = None  # [n, H] before the output, with tanh
    dense_bias: mx.array | None = None
    softmax: bool = False
    source: str = ""

    def outputs(self, hidden: mx.array, row: int = -1) -> mx.array:
        """The head's outputs ``[n_out]`` for a sequence's hidden states ``[T, H]``, read from
        ``row`` (the last for a decoder, the first for an encoder)."""
        x = hidden[row].astype(mx.float32)
        if self.dense is not None:
            x = self.dense.astype(mx.float32) @ x
            if self.dense_bias is not None:
                x = x + self.dense_bias
            x = mx.tanh(x)
        if self.output is not None:
            x = self.output.astype(mx.float32) @ x
            if self.output_bias is not None:
                x = x + self.output_bias
        return mx.softmax(x, axis=-1) if self.softmax else x

    def score(self, hidden: mx.array, row: int = -1) -> float:
        return float(self.outputs(hidden, row)[0].item())


def gguf_rank_head(tensors: dict[str, mx.array], architecture: str) -> RankHead | None:
    """The head a GGUF file carries in its ``cls.*`` tensors (None without ``cls.output.weight``
    or ``cls.weight``)."""
    output = tensors.get("cls.output.weight")
    dense = tensors.get("cls.weight")
    if output is None and dense is None:
        return None
    if output is None:  # only the dense layer (jina-reranker-v1): llama.cpp scores its tanh output
        return RankHead(None, dense=dense, dense_bias=tensors.get("cls.bias"), source="GGUF cls tensors")
    return RankHead(output, tensors.get("cls.output.bias"), dense, tensors.get("cls.bias"),
                    softmax=architecture in ("qwen3", "qwen3vl"), source="GGUF cls tensors")


def is_qwen3_reranker(path: Path, config: dict) -> bool:
    """Whether a checkpoint directory is a Qwen3-Reranker: its model card's title, or its name."""
    readme = path / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace").lower() if readme.is_file() else ""
    if "# qwen3-reranker" in text:
        return True
    hints = [path.name, str(config.get("_name_or_path", ""))]
    return any("qwen3-reranker" in h.lower() for h in hints)


def _rows(module: Any, rows: mx.array) -> mx.array:
    """Rows of a linear or embedding module's weight (dequantized if it is quantized)."""
    if hasattr(module, "scales"):
        biases = getattr(module, "biases", None)
        return mx.dequantize(module.weight[rows], module.scales[rows], None if biases is None else biases[rows],
                             group_size=module.group_size, bits=module.bits)
    return module.weight[rows]


def yes_no_head(model: Any, tokenizer: Any) -> RankHead | None:
    """A Qwen3 reranker's head: the LM head rows of "yes" and "no", under a softmax (None when the
    vocabulary lacks either word)."""
    vocab = getattr(tokenizer, "_tokenizer", tokenizer).get_vocab()
    if "yes" not in vocab or "no" not in vocab:
        return None
    rows = mx.array([vocab["yes"], vocab["no"]])
    head = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens
    return RankHead(_rows(head, rows), softmax=True, source="the LM head's yes/no rows (Qwen3 reranker)")
