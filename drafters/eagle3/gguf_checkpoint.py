"""Loading an EAGLE-3 drafter as llama.cpp's converter writes it: a GGUF file of architecture
``eagle3``, read into the same network as a checkpoint directory (``checkpoint.build``).

What the conversion changed, undone here:

* metadata: the Llama fields as ``eagle3.*`` keys (``embedding_length``, ``attention.head_count``,
  ...), plus ``eagle3.target_layers`` (the three target layers, always written, the default trio
  resolved against the target it was converted for), ``eagle3.target_hidden_size``,
  ``eagle3.norm_before_residual`` and ``eagle3.norm_before_fc``;
* tensor names: llama.cpp's (``blk.0.attn_q``, ``blk.0.attn_norm_2`` for ``hidden_norm``,
  ``enc.output_norm`` for ``input_norm``, ``output`` / ``output_norm`` / ``token_embd``);
* q/k rows permuted to llama.cpp's interleaved rotary layout (put back with
  ``engine.gguf.tensors.llama_qk_rows``);
* ``d2t`` stored as absolute target ids (int64), no longer offsets;
* Llama 3 RoPE scaling stored as a ``rope_freqs`` tensor of per-frequency divisors.

Any tensor type the ``gguf`` package decodes is read (dequantized to float).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.rope_utils import Llama3RoPE

from mlxcel.drafters.eagle3.checkpoint import Eagle3Checkpoint, build
from mlxcel.drafters.eagle3.spec import Eagle3Spec
from mlxcel.drafters.eagle3.structure import GGUF, GGUF_ARCHITECTURE
from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.file import GGUFFile, TensorInfo, read_gguf
from mlxcel.engine.gguf.metadata import ArchMetadata
from mlxcel.engine.gguf.rope import rope_scaling
from mlxcel.engine.gguf.tensors import dequantize_numpy, llama_qk_rows, permute_rows

_LAYER = {"attn_norm": "input_layernorm", "attn_norm_2": "hidden_norm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_TOP = {"fc": "fc", "enc.output_norm": "input_norm", "output_norm": "norm", "output": "lm_head",
        "token_embd": "embed_tokens"}
ROPE_FREQS = "rope_freqs.weight"


def our_name(gguf_name: str) -> str | None:
    """llama.cpp's tensor name -> the network's parameter name (None: not a network parameter)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{suffix}"
    if stem.startswith("blk.0.") and stem[len("blk.0."):] in _LAYER:
        return f"layers.0.{_LAYER[stem[len('blk.0.'):]]}.{suffix}"
    return None


def gguf_spec(f: GGUFFile, where: str) -> Eagle3Spec:
    meta = ArchMetadata(f.metadata, GGUF_ARCHITECTURE, where)
    if meta.int("block_count", 1) != 1:
        raise ModelLoadError(f"{where}: an EAGLE-3 drafter with {meta.int('block_count')} decoder layers; mlxcel (as "
                             "llama.cpp) runs the one-layer form")
    hidden, heads = meta.int("embedding_length"), meta.int("attention.head_count")
    layers = meta.raw("target_layers")
    if layers is None:
        raise ModelLoadError(f"{where} lacks eagle3.target_layers (the target layers it reads)")
    vocab = meta.int("vocab_size", None) or len(f.metadata.get("tokenizer.ggml.tokens") or []) or None
    d2t = f.tensors.get("d2t")
    return Eagle3Spec(
        layout=GGUF, hidden_size=hidden, num_heads=heads,
        num_kv_heads=meta.int("attention.head_count_kv", heads),
        head_dim=meta.int("attention.key_length", None) or meta.int("rope.dimension_count", None) or hidden // heads,
        intermediate_size=meta.int("feed_forward_length"),
        rms_norm_eps=meta.float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=meta.float("rope.freq_base", 10000.0),
        rope_scaling=rope_scaling(meta, ROPE_FREQS in f.tensors),
        max_position_embeddings=meta.int("context_length", 131072),
        vocab_size=vocab, draft_vocab_size=None if d2t is None else int(d2t.shape[-1]),
        target_hidden_size=meta.int("target_hidden_size", None),
        aux_layer_ids=tuple(int(i) for i in layers),
        norm_before_residual=meta.bool("norm_before_residual", False),
        norm_before_fc=meta.bool("norm_before_fc", False),
        attention_bias="blk.0.attn_q.bias" in f.tensors, mlp_bias="blk.0.ffn_gate.bias" in f.tensors)


def _float(info: TensorInfo, spec: Eagle3Spec) -> mx.array:
    """One tensor as float32, q/k rows back in Hugging Face's order."""
    if info.name.startswith(("blk.0.attn_q.", "blk.0.attn_k.")):
        heads = spec.num_heads if info.name.startswith("blk.0.attn_q.") else spec.num_kv_heads
        info = permute_rows(info, llama_qk_rows(info.shape[0], heads))
    return mx.array(dequantize_numpy(info))


def load_gguf(path: str | Path, *, dtype: mx.Dtype | None = mx.float32) -> Eagle3Checkpoint:
    path = Path(path).expanduser()
    f = read_gguf(path)
    if f.architecture != GGUF_ARCHITECTURE:
        raise ModelLoadError(f"{path} is a GGUF of architecture {f.architecture!r}, not an EAGLE-3 drafter ({GGUF_ARCHITECTURE})")
    where = str(path)
    spec = gguf_spec(f, where)
    tensors, unknown = {}, []
    for name, info in f.tensors.items():
        ours = our_name(name)
        if ours is not None:
            tensors[ours] = _float(info, spec)
        elif name not in ("d2t", ROPE_FREQS):
            unknown.append(name)
    if unknown:
        raise ModelLoadError(f"{where}: tensors an EAGLE-3 drafter does not have: {sorted(unknown)[:4]}")
    d2t = f.tensors.get("d2t")
    target_ids = None if d2t is None else np.asarray(d2t.data, dtype=np.int64).reshape(-1)
    checkpoint = build(spec, tensors, target_ids, where, dtype=dtype)
    if ROPE_FREQS in f.tensors:
        _stored_rope_freqs(checkpoint, dequantize_numpy(f.tensors[ROPE_FREQS]).reshape(-1))
    return checkpoint


def _stored_rope_freqs(checkpoint: Eagle3Checkpoint, factors: np.ndarray) -> None:
    """Llama 3 scaling as the file stores it: dimension pair ``i`` turns at ``theta^(-2i/d) / factors[i]``."""
    spec = checkpoint.spec
    rope = checkpoint.network.layers[0].self_attn.rope
    base = mx.array(spec.rope_theta, dtype=mx.float32) ** (mx.arange(0, spec.head_dim, 2, dtype=mx.float32)
                                                             / spec.head_dim)
    if not isinstance(rope, Llama3RoPE) or factors.size != base.size:
        raise ModelLoadError(f"{checkpoint.where}: rope_freqs has {factors.size} entries for a head of "
                             f"{spec.head_dim} dimensions")
    rope._freqs = base * mx.array(factors)
