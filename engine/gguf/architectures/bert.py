"""``bert``, ``nomic-bert`` and ``jina-bert-v2``: the BERT-family encoders llama.cpp's converter
writes, read into an :class:`EncoderSpec` (the hyperparameters and which tensors each layer has).

Unlike the decoder architectures beside it, these have no mlx-lm class: mlxcel runs them with its
own encoder (``engine.model.encoder``), whose parameters carry llama.cpp's tensor names, so no
name mapping is needed here; this module only says what the network must look like.

What the three families share (llama.cpp's BERT graph): token embeddings plus the first row of the
token-type table, a LayerNorm, then post-norm layers (attention, add, LayerNorm; feed-forward, add,
LayerNorm), bidirectional attention and no KV cache. Where they differ:

- ``bert`` (BERT, RoBERTa, DistilBERT, CamemBERT, XLM-RoBERTa: bge, e5, MiniLM, bge-reranker):
  learned absolute positions (``position_embd``; a RoBERTa's table is already cut to start at 0),
  separate q/k/v with biases, GELU feed-forward;
- ``nomic-bert`` (nomic-embed-text v1/v1.5): rotary positions (NeoX halves, ``rope.freq_base``),
  one fused ``attn_qkv``, a SwiGLU feed-forward (``silu(gate) * up``), no biases;
- ``jina-bert-v2`` (jina-embeddings-v2, jina-reranker-v1): ALiBi (a per-head slope times the
  distance, maximum bias 8), optional q/k LayerNorms and a second attention norm, a GEGLU
  feed-forward with the gate either its own tensor or the first half of ``ffn_up``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.metadata import ArchMetadata

SERVED = ("bert", "nomic-bert", "jina-bert-v2")

# The encoder architectures llama.cpp writes that mlxcel does not run, and what each lacks.
NOT_SERVED = {
    "nomic-bert-moe": "its mixture-of-experts feed-forward layers (nomic-embed-text-v2-moe) are not implemented",
    "jina-bert-v3": "its rotary XLM-RoBERTa layers and per-task LoRA adapters (jina-embeddings-v3) are not implemented",
    "modern-bert": "its alternating local/global attention and GLU layers (ModernBERT) are not implemented",
    "neo-bert": "its pre-norm rotary SwiGLU layers (NeoBERT) are not implemented",
    "eurobert": "its pre-norm rotary layers (EuroBERT, jina-embeddings-v5) are not implemented",
    "t5encoder": "T5 encoders (relative position buckets) are not implemented",
}

# llama.cpp's defaults for a bert vocabulary whose file names no special tokens
WPM_DEFAULT_IDS = {"bos": 101, "unk": 100, "sep": 102}

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
GLOBAL_TENSORS = ("token_embd.weight", "token_types.weight", "position_embd.weight", "token_embd_norm.weight",
                  "token_embd_norm.bias")


@dataclass(frozen=True)
class EncoderSpec:
    """One encoder's shape: enough to build the network and to check the file's tensors against it."""

    arch: str
    n_layer: int
    hidden: int
    n_head: int
    n_ff: int
    eps: float
    n_ctx_train: int
    vocab_size: int
    position: str  # "absolute" | "rope" | "alibi"
    ffn: str  # "gelu" (up, GELU, down) | "swiglu" | "geglu" (separate gate) | "geglu_fused" (gate = up's first half)
    layer_tensors: frozenset[str]  # block 0's tensor names after "blk.0.", e.g. "attn_q.bias"
    n_token_types: int = 0  # rows of token_types (0: the file has no table)
    n_positions: int = 0  # rows of position_embd (absolute positions only)
    rope_base: float = 10000.0
    rope_dims: int = 0
    max_alibi_bias: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    @property
    def fused_qkv(self) -> bool:
        return "attn_qkv.weight" in self.layer_tensors

    def has(self, name: str) -> bool:
        """Whether every layer has tensor ``name`` (after ``blk.N.``)."""
        return name in self.layer_tensors


def encoder_spec(metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], source: str) -> EncoderSpec:
    """The :class:`EncoderSpec` of a GGUF file of one of :data:`SERVED` (``shapes``: every tensor's
    shape, numpy order); a ``ModelLoadError`` naming what is wrong otherwise."""
    arch = str(metadata.get("general.architecture"))
    if arch not in SERVED:
        raise ModelLoadError(f"{source}: {arch!r} is not a BERT-family architecture mlxcel runs")
    meta = ArchMetadata(metadata, arch, source)
    n_layer, hidden, n_head = meta.int("block_count"), meta.int("embedding_length"), meta.int("attention.head_count")
    if hidden % n_head:
        raise ModelLoadError(f"{source}: embedding_length {hidden} is not a multiple of head_count {n_head}")
    if meta.int("attention.head_count_kv", n_head) != n_head:
        raise ModelLoadError(f"{source}: grouped key/value heads in a {arch} encoder are not supported")
    if meta.bool("attention.causal", False):
        raise ModelLoadError(f"{source}: a {arch} file with causal attention is not an encoder mlxcel runs")
    if "token_embd.weight" not in shapes:
        raise ModelLoadError(f"{source} has no token_embd.weight tensor")
    layer = _layer_tensors(shapes, n_layer, source)
    n_ff = meta.int("feed_forward_length")
    spec = dict(arch=arch, n_layer=n_layer, hidden=hidden, n_head=n_head, n_ff=n_ff,
                eps=meta.float("attention.layer_norm_epsilon", 1e-12), n_ctx_train=meta.int("context_length"),
                vocab_size=int(shapes["token_embd.weight"][0]), layer_tensors=layer,
                n_token_types=int(shapes.get("token_types.weight", (0,))[0]))
    if arch == "bert":
        if "position_embd.weight" not in shapes:
            raise ModelLoadError(f"{source}: a bert file needs its position_embd.weight table")
        rows = int(shapes["position_embd.weight"][0])
        spec.update(position="absolute", ffn="gelu", n_positions=rows, n_ctx_train=min(spec["n_ctx_train"], rows))
    elif arch == "nomic-bert":
        spec.update(position="rope", ffn="swiglu", rope_base=meta.float("rope.freq_base", 10000.0),
                    rope_dims=meta.int("rope.dimension_count", hidden // n_head))
    else:
        up_rows = int(shapes.get("blk.0.ffn_up.weight", (n_ff,))[0])
        gated = "geglu" if "ffn_gate.weight" in layer else ("geglu_fused" if up_rows == 2 * n_ff else "gelu")
        spec.update(position="alibi", ffn=gated, max_alibi_bias=8.0)
    _check_layout(spec, shapes, source)
    return EncoderSpec(**spec)


def _layer_tensors(shapes: dict[str, tuple[int, ...]], n_layer: int, source: str) -> frozenset[str]:
    """Block 0's tensor names, checked to be every block's (llama.cpp builds every layer alike)."""
    per_block: dict[int, set[str]] = {}
    for name in shapes:
        m = _BLOCK.match(name)
        if m:
            per_block.setdefault(int(m.group(1)), set()).add(m.group(2))
    if sorted(per_block) != list(range(n_layer)):
        raise ModelLoadError(f"{source}: block_count is {n_layer}, the tensors are of blocks {sorted(per_block)}")
    first = per_block[0]
    for bid, names in per_block.items():
        if names != first:
            raise ModelLoadError(f"{source}: block {bid} has tensors {sorted(names ^ first)} that block 0 "
                                 "does not match; mixed layer layouts are not supported")
    return frozenset(first)


def _check_layout(spec: dict, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """Every tensor the family requires is there, and nothing the network would not read is."""
    layer = spec["layer_tensors"]
    qkv = {"attn_qkv.weight"} if "attn_qkv.weight" in layer else {"attn_q.weight", "attn_k.weight", "attn_v.weight"}
    norms = {f"{n}.{p}" for n in ("attn_output_norm", "layer_output_norm") for p in ("weight", "bias")}
    required = qkv | norms | {"attn_output.weight", "ffn_up.weight", "ffn_down.weight"}
    if spec["ffn"] == "swiglu":
        required.add("ffn_gate.weight")
    missing = sorted(required - layer) + [n for n in ("token_embd_norm.weight", "token_embd_norm.bias")
                                          if n not in shapes]
    if missing:
        raise ModelLoadError(f"{source}: a {spec['arch']} file needs tensors it lacks: {', '.join(missing)}")
    optional = {f"{n}.bias" for n in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_up",
                                      "ffn_down")}
    if spec["arch"] == "jina-bert-v2":  # llama.cpp reads these for jina-bert-v2 only
        optional |= {f"{n}.{p}" for n in ("attn_q_norm", "attn_k_norm", "attn_norm_2") for p in ("weight", "bias")}
        optional |= {"ffn_gate.weight"}
    unknown = sorted(layer - required - optional)
    unknown += sorted(n for n in shapes if not _BLOCK.match(n) and n not in GLOBAL_TENSORS
                      and not n.startswith("cls."))
    if unknown:
        raise ModelLoadError(f"{source}: tensors a {spec['arch']} encoder does not use: {', '.join(unknown)}; "
                             "this layout is not supported")
