"""What one ``general.architecture`` needs: an mlx-lm config from the metadata, and for every
mlx-lm parameter the GGUF tensor(s) it comes from with the converter's changes undone.

An ``Architecture`` answers three questions for the loader:

- ``config(meta, tensors, vocab_size)``: the Hugging Face style config mlx-lm's model class takes,
  with llama.cpp's defaults for keys a file may omit (its own ``load_arch_hparams``);
- ``conversion(param, ...)``: which tensor(s) make one parameter, which of their rows in which
  order (``rows``, safe on quantized blocks since a block never spans two rows), and what float
  arithmetic turns the stored values into mlx-lm's (``value``: Gemma's ``1 + w`` norms, a
  reshaped convolution kernel, a split per head);
- ``refusal(meta, tensors)``: a sentence saying what is missing when we cannot run a file right.

The base class maps names through gguf's ``TensorNameMap`` (``names.py``) and undoes the llama
q/k permutation where the converter applied it; subclasses override the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.metadata import ArchMetadata
from mlxcel.engine.gguf.names import gguf_names
from mlxcel.engine.gguf.rope import rope_scaling
from mlxcel.engine.gguf.tensors import llama_qk_rows

ValueFn = Callable[..., mx.array]


@dataclass
class Conversion:
    """One mlx-lm parameter made from GGUF tensors.

    ``rows`` (a row index array into the sources' rows stacked in order; for a stack of expert
    matrices, the rows of each) works on raw blocks, so a quantized tensor stays quantized;
    ``value`` gets every source as a float32 array and returns the parameter, so its sources
    are dequantized."""

    sources: tuple[str, ...]
    rows: np.ndarray | None = None
    value: ValueFn | None = None
    shape: tuple[int, ...] | None = None  # the parameter's shape in mlx-lm (set by the planner)


@dataclass
class TensorIndex:
    """The tensor names and shapes (numpy order) of a GGUF file, and a way to read a small
    tensor's values (rope factors) when the config needs them."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    reader: Callable[[str], np.ndarray] | None = None

    def values(self, name: str) -> np.ndarray:
        if self.reader is None:
            raise ModelLoadError(f"the values of tensor {name!r} are needed but cannot be read here")
        return self.reader(name)

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def __iter__(self):
        return iter(self.shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]


_QK = re.compile(r"^blk\.\d+\.attn_([qk])\.(weight|bias)$")
_FUSABLE = re.compile(r"^blk\.(\d+)\.(attn_q|attn_k|attn_v|ffn_gate_exps|ffn_up_exps)\.(weight|bias)$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def minus_one(x: mx.array) -> mx.array:
    """Gemma-style norms: llama.cpp stores ``1 + w``, mlx-lm's RMSNorm adds the 1 itself."""
    return x - 1.0


class Architecture:
    """The default mapping: names through gguf's table, llama's q/k permutation undone where
    ``permuted_qk``, norms shifted where ``norm_offset``."""

    name: str = ""  # general.architecture
    model_type: str = ""  # mlx-lm module under mlx_lm.models
    hf_class: str = ""
    permuted_qk = False  # convert_hf_to_gguf reordered q/k rows for llama.cpp's interleaved RoPE
    norm_offset = False  # norms stored as 1 + w
    # Tensors the config carries (or llama.cpp alone uses); present in a file, but no parameter.
    ignored: tuple[str, ...] = ("rope_freqs.weight",)
    partial_rotary = False  # whether mlx-lm's class rotates fewer dims than the head holds

    # -- config -------------------------------------------------------------------------------
    def config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        return self.common_config(meta, tensors, vocab_size)

    def common_config(self, meta: ArchMetadata, tensors: TensorIndex, vocab_size: int) -> dict[str, Any]:
        hidden = meta.int("embedding_length")
        n_head = meta.int("attention.head_count")
        n_kv = self.kv_heads(meta, n_head)
        head_dim = meta.int("attention.key_length", hidden // n_head)
        rope_dim = meta.int("rope.dimension_count", head_dim)
        if rope_dim != head_dim and not self.partial_rotary:
            raise ModelLoadError(f"{meta.source}: partial rotary embeddings ({rope_dim} of {head_dim} dims) "
                                 f"are not supported for architecture {self.name!r}")
        config: dict[str, Any] = {
            "model_type": self.model_type,
            "architectures": [self.hf_class],
            "hidden_size": hidden,
            "num_hidden_layers": self.n_layers(meta),
            "num_attention_heads": n_head,
            "num_key_value_heads": n_kv,
            "head_dim": head_dim,
            "rms_norm_eps": meta.float("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": meta.float("rope.freq_base", 10000.0),
            "max_position_embeddings": meta.int("context_length", 4096),
            "vocab_size": vocab_size,
            "tie_word_embeddings": "output.weight" not in tensors,
        }
        if meta.has("feed_forward_length"):
            config["intermediate_size"] = meta.int("feed_forward_length")
        scaling = rope_scaling(meta, "rope_freqs.weight" in tensors)
        if scaling is not None:
            config["rope_scaling"] = scaling
        return config

    def kv_heads(self, meta: ArchMetadata, n_head: int) -> int:
        """Key/value heads of the attention layers (one number; hybrids override this)."""
        return meta.int("attention.head_count_kv", n_head)

    def n_layers(self, meta: ArchMetadata) -> int:
        """Decoder layers mlx-lm builds: ``block_count`` less any next-token-prediction layers
        the file appends (llama.cpp's ``nextn_predict_layers``)."""
        return meta.int("block_count") - meta.int("nextn_predict_layers", 0)

    def refusal(self, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        """Why this file cannot be served right (None when it can)."""
        return None

    # -- tensors ------------------------------------------------------------------------------
    def gguf_name(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> str | None:
        """The tensor of this file holding ``param``, if it has one."""
        return next((n for n in gguf_names(self.name, meta.int("block_count"), param) if n in tensors), None)

    def conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        """How ``param`` is made, or None when the file has no tensor for it."""
        source = self.gguf_name(param, config, meta, tensors)
        if source is None:
            return self.fused_conversion(param, config, meta, tensors)
        conv = Conversion((source,))
        qk = _QK.match(source)
        if self.permuted_qk and qk:
            heads = config["num_attention_heads"] if qk.group(1) == "q" else config["num_key_value_heads"]
            conv.rows = llama_qk_rows(tensors.shape(source)[0], heads)
        if self.norm_offset and source.endswith("norm.weight"):
            conv.value = minus_one
        return conv

    def fused_conversion(self, param: str, config: dict, meta: ArchMetadata, tensors: TensorIndex) -> Conversion | None:
        """A parameter the file holds inside a fused tensor (the converter's ``--fuse-qkv`` and
        ``--fuse-gate-up-exps``): q, k, v rows of ``attn_qkv``; gate, up rows of
        ``ffn_gate_up_exps``. Rows only, so quantized blocks stay as they are."""
        expected = gguf_names(self.name, meta.int("block_count"), param)
        match = _FUSABLE.match(expected[0]) if expected else None
        if match is None:
            return None
        bid, kind, suffix = match.groups()
        if kind.startswith("attn_"):
            fused = f"blk.{bid}.attn_qkv.{suffix}"
            if fused not in tensors:
                return None
            head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
            q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
            start, size, heads = {"attn_q": (0, q, config["num_attention_heads"]),
                                  "attn_k": (q, kv, config["num_key_value_heads"]),
                                  "attn_v": (q + kv, kv, None)}[kind]
            order = np.arange(size)
            if self.permuted_qk and heads is not None:
                order = llama_qk_rows(size, heads)
            return Conversion((fused,), rows=start + order)
        fused = f"blk.{bid}.ffn_gate_up_exps.{suffix}"
        if suffix != "weight" or fused not in tensors:
            return None
        ff = tensors.shape(fused)[-2] // 2
        return Conversion((fused,), rows=np.arange(ff) + (0 if kind == "ffn_gate_exps" else ff))

    def optional(self, param: str, config: dict, tensors: TensorIndex) -> bool:
        """Whether the model may do without ``param`` (``prepare`` then removes it)."""
        return False

    def prepare(self, model, weights: dict) -> None:
        """Adjust the freshly built mlx-lm model to the weights the file gives it, before they
        are loaded (e.g. tie the output head to the embeddings when the file has no head)."""

    def is_ignored(self, name: str, config: dict) -> bool:
        """A tensor in the file that no parameter needs: known extras, a reranker's classifier
        head (``cls.*``), and the appended next-token-prediction blocks (mlxcel does not run a
        GGUF's MTP head)."""
        if name in self.ignored or name.startswith("cls."):  # a rank head: engine.embedding reads it
            return True
        block = _BLOCK.match(name)
        return block is not None and int(block.group(1)) >= config["num_hidden_layers"]

    def finish(self, model, gguf_file, config: dict) -> None:
        """Adjust the loaded model where the file carries what mlx-lm computes (rope factors)."""
