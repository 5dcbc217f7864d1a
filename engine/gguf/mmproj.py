"""A multimodal projector GGUF (llama-server's ``--mmproj`` file) read onto mlx-vlm's vision modules.

llama.cpp's converter (``convert_hf_to_gguf.py --mmproj``) writes a vision tower and its projector as
a ``general.architecture = "clip"`` file: hyperparameters under ``clip.vision.*``, the projector's kind
in ``clip.projector_type``, tensors named ``v.*`` (the tower) and ``mm.*`` (the projector). This module
reads such a file and returns each tensor under the name mlx-vlm's module for that family gives the
same weight, in mlx-vlm's layout, with the converter's changes undone, as ``architectures/`` does for
text models:

- ``gemma3`` (SigLIP + Gemma 3's pooling projector): convolution kernels channels-last again, the
  soft-embedding norm stored as ``1 + w`` back to ``w`` (mlx-vlm's Gemma RMSNorm adds the 1);
- ``qwen2.5vl_merger`` (Qwen2.5-VL's windowed ViT + patch merger): the q, k and v projections the
  converter split joined into one ``qkv`` again, and the 3-D patch kernel it cut into two 2-D ones
  (``v.patch_embd.weight`` and ``.weight.1``, one per temporal frame) stacked back.

Any other projector kind is refused by name (its tensors would load into nothing, or worse, into the
wrong shapes). Nothing here imports mlx-vlm: the names are plain strings, the values numpy arrays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.file import GGUFFile, read_gguf
from mlxcel.engine.gguf.tensors import dequantize_numpy

# llama.cpp's projector type -> the mlx-vlm model package whose vision modules run it
SERVED = {"gemma3": "gemma3", "qwen2.5vl_merger": "qwen2_5_vl"}


@dataclass
class Mmproj:
    """A projector file, read: what it is, its ``clip.vision.*`` hyperparameters (keys without the
    prefix), and its tensors as mlx-vlm parameters (float32, mlx-vlm's layouts)."""

    path: Path
    projector: str
    family: str
    hparams: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def int(self, key: str, default: int | None = None) -> int:
        value = self.hparams.get(key, default)
        if value is None:
            raise ModelLoadError(f"{self.path} lacks required metadata clip.vision.{key}")
        return int(value)

    def floats(self, key: str) -> list[float]:
        value = self.hparams.get(key)
        if value is None:
            raise ModelLoadError(f"{self.path} lacks required metadata clip.vision.{key}")
        return [float(v) for v in value]


def projector_type(gguf_file: GGUFFile) -> str:
    """The file's projector kind, checked to be a vision projector file at all."""
    meta = gguf_file.metadata
    if meta.get("general.architecture") != "clip":
        raise ModelLoadError(f"{gguf_file.path} is not a multimodal projector (general.architecture is "
                             f"{meta.get('general.architecture')!r}, not 'clip'); --mmproj takes the mmproj-*.gguf file")
    if not meta.get("clip.has_vision_encoder", False):
        raise ModelLoadError(f"{gguf_file.path} has no vision encoder (an audio-only projector); mlxcel serves images only")
    kind = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type")
    if not isinstance(kind, str):
        raise ModelLoadError(f"{gguf_file.path} has no clip.projector_type")
    return kind


def read_mmproj(path: str | Path) -> Mmproj:
    """The projector at ``path`` as mlx-vlm parameters; ``ModelLoadError`` for a file that is not a
    projector, a projector kind mlxcel does not run (named), or a tensor that maps nowhere."""
    path = Path(path)
    gguf_file = read_gguf(path)
    kind = projector_type(gguf_file)
    if kind not in SERVED:
        raise ModelLoadError(f"unsupported multimodal projector type {kind!r} in {path}; mlxcel runs "
                             + ", ".join(sorted(SERVED)) + " (Gemma 3 and Qwen2.5-VL)")
    hparams = {k.removeprefix("clip.vision."): v for k, v in gguf_file.metadata.items() if k.startswith("clip.vision.")}
    hparams["use_gelu"] = gguf_file.metadata.get("clip.use_gelu")
    hparams["use_silu"] = gguf_file.metadata.get("clip.use_silu")
    arrays = {name: dequantize_numpy(info).reshape(info.shape) for name, info in gguf_file.tensors.items()}
    mapper = _gemma3_weights if kind == "gemma3" else _qwen25vl_weights
    return Mmproj(path, kind, SERVED[kind], hparams, mapper(arrays, path))


def _unmapped(names, path: Path) -> ModelLoadError:
    listed = ", ".join(sorted(names)[:6])
    return ModelLoadError(f"{path}: tensors the projector's modules have no place for: {listed}")


_SIGLIP_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_out|ln1|ln2|ffn_up|ffn_down)\.(weight|bias)$")
_SIGLIP_PARTS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2",
                 "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}


def _gemma3_weights(arrays: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    tower = "vision_tower.vision_model."
    out, left = {}, []
    for name, value in arrays.items():
        block = _SIGLIP_BLOCK.match(name)
        if block:
            layer, part, suffix = block.groups()
            out[f"{tower}encoder.layers.{layer}.{_SIGLIP_PARTS[part]}.{suffix}"] = value
        elif name == "v.patch_embd.weight":  # [out, in, kh, kw] -> mlx's [out, kh, kw, in]
            out[f"{tower}embeddings.patch_embedding.weight"] = value.transpose(0, 2, 3, 1)
        elif name == "v.patch_embd.bias":
            out[f"{tower}embeddings.patch_embedding.bias"] = value
        elif name == "v.position_embd.weight":
            out[f"{tower}embeddings.position_embedding.weight"] = value
        elif name.startswith("v.post_ln."):
            out[f"{tower}post_layernorm.{name.rsplit('.', 1)[1]}"] = value
        elif name == "mm.input_projection.weight":
            out["multi_modal_projector.mm_input_projection_weight"] = value
        elif name == "mm.soft_emb_norm.weight":  # stored 1 + w; mlx-vlm's norm adds the 1 itself
            out["multi_modal_projector.mm_soft_emb_norm.weight"] = value - 1.0
        else:
            left.append(name)
    if left:
        raise _unmapped(left, path)
    return out


_QWEN_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_out|ln1|ln2|ffn_gate|ffn_up|ffn_down)\.(weight|bias)$")
_QWEN_PARTS = {"attn_out": "attn.proj", "ln1": "norm1", "ln2": "norm2", "ffn_gate": "mlp.gate_proj",
               "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _qwen25vl_weights(arrays: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    tower = "vision_tower."
    out, left, qkv = {}, [], {}
    for name, value in arrays.items():
        block = _QWEN_BLOCK.match(name)
        if block:
            layer, part, suffix = block.groups()
            if part in ("attn_q", "attn_k", "attn_v"):
                qkv.setdefault((layer, suffix), {})[part] = value
            else:
                out[f"{tower}blocks.{layer}.{_QWEN_PARTS[part]}.{suffix}"] = value
        elif name == "v.post_ln.weight":
            out[f"{tower}merger.ln_q.weight"] = value
        elif name in ("mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias"):
            out[f"{tower}merger.mlp.{name[3:]}"] = value
        elif name not in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
            left.append(name)
    if left:
        raise _unmapped(left, path)
    for (layer, suffix), parts in qkv.items():
        if len(parts) != 3:
            raise ModelLoadError(f"{path}: layer {layer}'s attention lacks one of q, k, v ({sorted(parts)})")
        out[f"{tower}blocks.{layer}.attn.qkv.{suffix}"] = np.concatenate([parts["attn_q"], parts["attn_k"], parts["attn_v"]])
    frames = [arrays.get("v.patch_embd.weight"), arrays.get("v.patch_embd.weight.1")]
    if any(f is None for f in frames):
        raise ModelLoadError(f"{path}: the patch embedding needs both temporal frames (v.patch_embd.weight and .weight.1)")
    # two [out, in, kh, kw] kernels -> mlx's Conv3d [out, t, kh, kw, in]
    out[f"{tower}patch_embed.proj.weight"] = np.stack([f.transpose(0, 2, 3, 1) for f in frames], axis=1)
    return out
