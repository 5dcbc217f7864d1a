"""Tiny random vision-language checkpoints in the layouts people actually hold them in.

- ``build_vlm_dir(out, family)``: an MLX vision checkpoint as mlx-vlm saves one (``config.json`` with
  ``text_config`` / ``vision_config``, ``model.safetensors`` + its index with mlx-vlm's parameter
  names and layouts, ``preprocessor_config.json``, the tokenizer), for the Gemma 3 and Qwen2.5-VL
  families. The weights are mlx-vlm's own classes' initialisation (seeded), with the embeddings and
  the output head redrawn so a random model's choices depend on its input.
- ``write_text_gguf(vlm_dir, out)``: the text model of that checkpoint as llama.cpp's converter writes
  it (``gguf_convert.convert`` on its language-model half);
- ``write_mmproj(vlm_dir, out)``: its projector as ``convert_hf_to_gguf.py --mmproj`` writes it: the
  Hugging Face tensors (mlx-vlm's layouts undone) named through gguf's ``TensorNameMap`` for
  ``MMPROJ``, the converter's changes (Gemma 3's ``1 + w`` soft-embedding norm, Qwen2.5-VL's q/k/v
  split and its 3-D patch kernel split into two 2-D ones) and the ``clip.*`` metadata it writes.

What the converter does is re-stated from reading ``conversion/gemma.py``, ``conversion/qwenvl.py``
and ``MmprojModel`` in the llama.cpp sources; nothing here is taken from its code.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from tiny_checkpoints import build_tokenizer

GEMMA3_SPECIAL = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
QWEN_SPECIAL = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
SIGLIP_MEAN = [0.5, 0.5, 0.5]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _token_ids(out: Path, names: tuple[str, ...]) -> dict[str, int]:
    vocab = json.loads((out / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    return {name: ids[name] for name in names}


def gemma3_config(vocab: int, ids: dict[str, int]) -> dict:
    text = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": vocab,
            "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 16,
            "rope_theta": 1_000_000.0, "rope_global_base_freq": 1_000_000.0, "rope_local_base_freq": 10_000.0,
            "mm_tokens_per_image": 4, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "patch_size": 8, "image_size": 32, "layer_norm_eps": 1e-6}
    return {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "vocab_size": vocab,
            "image_token_index": ids["<image_soft_token>"], "boi_token_index": ids["<start_of_image>"],
            "eoi_token_index": ids["<end_of_image>"], "mm_tokens_per_image": 4, "hidden_size": 64,
            "eos_token_id": 2, "text_config": text, "vision_config": vision}


def qwen25vl_config(vocab: int, ids: dict[str, int]) -> dict:
    vision = {"model_type": "qwen2_5_vl", "depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": 64, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "window_size": 112, "fullatt_block_indexes": [1], "in_channels": 3, "in_chans": 3}
    return {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vocab_size": vocab,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "tie_word_embeddings": False,
            "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
            "eos_token_id": 2, "vision_config": vision}


def _preprocessor(family: str) -> dict:
    if family == "gemma3":
        return {"image_processor_type": "Gemma3ImageProcessor", "image_mean": SIGLIP_MEAN, "image_std": SIGLIP_MEAN,
                "size": {"height": 32, "width": 32}, "resample": 2, "rescale_factor": 1 / 255,
                "image_seq_length": 4, "do_normalize": True, "do_resize": True, "do_convert_rgb": True}
    return {"image_processor_type": "Qwen2VLImageProcessor", "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "min_pixels": 4 * 16 * 16, "max_pixels": 64 * 16 * 16, "patch_size": 8, "merge_size": 2,
            "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_resize": True, "do_convert_rgb": True}


def build_vlm_dir(out: Path, family: str = "gemma3", *, seed: int = 0) -> Path:
    """A tiny ``family`` ("gemma3" or "qwen2_5_vl") checkpoint as mlx-vlm saves one; returns ``out``."""
    from mlx_vlm.utils import save_config, save_weights, update_module_configs

    special = GEMMA3_SPECIAL if family == "gemma3" else QWEN_SPECIAL
    vocab = build_tokenizer(out, extra_special=special)
    ids = _token_ids(out, special)
    config = gemma3_config(vocab, ids) if family == "gemma3" else qwen25vl_config(vocab, ids)
    arch = importlib.import_module(f"mlx_vlm.models.{family}")
    raw = json.loads(json.dumps(config))
    raw.setdefault("text_config", {})  # as mlx-vlm's loader: a flat text config is the top level's
    model_config = update_module_configs(arch.ModelConfig.from_dict(raw), arch, raw, ["text", "vision"])
    mx.random.seed(seed)
    model = arch.Model(model_config)
    params = {k: v.astype(mx.float32) for k, v in tree_flatten(model.parameters())}
    for name in params:
        if name.endswith("embed_tokens.weight"):
            params[name] = mx.random.normal(params[name].shape)
        elif name.endswith("lm_head.weight"):
            params[name] = mx.random.normal(params[name].shape) * 0.5
        elif name.startswith(("vision_tower.", "multi_modal_projector.")) and name.endswith(".bias"):
            params[name] = mx.random.normal(params[name].shape) * 0.1
    if family == "gemma3":
        params.pop("language_model.lm_head.weight", None)  # Gemma 3 ties its head to the embeddings
    model.load_weights(list(params.items()), strict=False)
    if family == "gemma3":
        model.language_model.pop("lm_head", None)
    save_weights(out, model)
    save_config(config, out / "config.json")
    (out / "preprocessor_config.json").write_text(json.dumps(_preprocessor(family), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return out


def vlm_weights(vlm_dir: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(vlm_dir / "model.safetensors")).items()}


# -- the text model as llama.cpp's converter writes it ---------------------------------------------------------


def write_text_gguf(vlm_dir: Path, out: Path) -> Path:
    """The checkpoint's language model as a GGUF (``gguf_convert.convert`` on an HF text-only copy)."""
    from gguf_convert import convert

    config = json.loads((vlm_dir / "config.json").read_text())
    family = config["model_type"]
    with tempfile.TemporaryDirectory() as tmp:
        text_dir = Path(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(vlm_dir / name, text_dir / name)
        weights = {k.removeprefix("language_model."): mx.array(v) for k, v in vlm_weights(vlm_dir).items()
                   if k.startswith("language_model.")}
        if family == "gemma3":
            text = dict(config["text_config"])
            arch = "gemma3"
        else:
            text = {k: v for k, v in config.items() if k not in ("vision_config", "architectures")}
            text.update(model_type="qwen2_vl")
            arch = "qwen2vl"
        mx.save_safetensors(str(text_dir / "model.safetensors"), weights, metadata={"format": "pt"})
        (text_dir / "config.json").write_text(json.dumps(text))
        return convert(text_dir, out, arch)


# -- the projector as convert_hf_to_gguf.py --mmproj writes it ------------------------------------------------------


def _hf_vision_tensors(family: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The vision half of the checkpoint as the Hugging Face checkpoint holds it (mlx-vlm's sanitize undone:
    convolution kernels channels-first, Qwen's tower named ``visual``)."""
    out = {}
    for key, value in weights.items():
        if key.startswith("language_model."):
            continue
        if key.endswith("patch_embedding.weight"):  # mlx [out, kh, kw, in] -> torch [out, in, kh, kw]
            value = value.transpose(0, 3, 1, 2)
        elif key.endswith("patch_embed.proj.weight"):  # mlx [out, t, kh, kw, in] -> torch [out, in, t, kh, kw]
            value = value.transpose(0, 4, 1, 2, 3)
        if family == "qwen2_5_vl":
            key = key.replace("vision_tower.", "visual.", 1)
        out[key] = value
    return out


def _mmproj_tensors(family: str, hf: dict[str, np.ndarray], n_blocks: int) -> dict[str, np.ndarray]:
    from gguf import MODEL_ARCH, TensorNameMap

    tmap = TensorNameMap(MODEL_ARCH.MMPROJ, n_blocks)
    named = {}
    for name, value in hf.items():
        name = name.replace("_weight", ".weight")  # Gemma 3's mm_input_projection_weight
        if family == "gemma3" and "soft_emb_norm.weight" in name:
            value = value + 1.0
        if family == "qwen2_5_vl" and ".qkv." in name:
            c = value.shape[0] // 3
            pieces = {"q": value[:c], "k": value[c:2 * c], "v": value[2 * c:]}
            for part, piece in pieces.items():
                named[tmap.get_name(name.replace("qkv", part), try_suffixes=(".weight", ".bias"))] = piece
            continue
        if family == "qwen2_5_vl" and "patch_embed.proj.weight" in name:
            named["v.patch_embd.weight"] = value[:, :, 0]
            named["v.patch_embd.weight.1"] = value[:, :, 1]
            continue
        gguf_name = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"cannot map {name!r}")
        named[gguf_name] = value
    return named


def write_mmproj(vlm_dir: Path, out: Path) -> Path:
    """The checkpoint's vision tower and projector as an mmproj GGUF, as the converter writes it."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFType, GGUFWriter

    config = json.loads((vlm_dir / "config.json").read_text())
    family = config["model_type"]
    pre = json.loads((vlm_dir / "preprocessor_config.json").read_text())
    vision = config["vision_config"]
    w = GGUFWriter(str(out), "clip")
    w.add_type(GGUFType.MMPROJ)
    w.add_string("general.name", f"tiny-{family}")
    w.add_file_type(0)
    w.add_clip_has_vision_encoder(True)
    text_hidden = (config.get("text_config") or config)["hidden_size"]
    w.add_vision_projection_dim(text_hidden)
    n_blocks = vision.get("num_hidden_layers") or vision["depth"]
    if family == "gemma3":
        w.add_clip_projector_type("gemma3")
        w.add_vision_image_size(vision["image_size"])
        w.add_vision_embedding_length(vision["hidden_size"])
        w.add_vision_feed_forward_length(vision["intermediate_size"])
        w.add_vision_head_count(vision["num_attention_heads"])
        w.add_vision_attention_layernorm_eps(vision.get("layer_norm_eps", 1e-6))
        w.add_vision_use_gelu(True)
        side = int(pre.get("image_seq_length", 256) ** 0.5)
        factor = (vision["image_size"] // vision["patch_size"]) // side
        if factor > 0 and factor != 4:
            w.add_vision_projector_scale_factor(factor)
    else:
        w.add_clip_projector_type("qwen2.5vl_merger")
        w.add_vision_image_size(vision.get("image_size", 560))
        w.add_vision_embedding_length(vision["hidden_size"])
        w.add_vision_feed_forward_length(vision["intermediate_size"])
        w.add_vision_head_count(vision["num_heads"])
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(vision["fullatt_block_indexes"][0] + 1)
        w.add_vision_attention_layernorm_eps(config.get("rms_norm_eps", 1e-6))
    w.add_vision_patch_size(vision["patch_size"])
    w.add_vision_block_count(n_blocks)
    w.add_vision_image_mean(pre["image_mean"])
    w.add_vision_image_std(pre["image_std"])
    for name, value in _mmproj_tensors(family, _hf_vision_tensors(family, vlm_weights(vlm_dir)), n_blocks).items():
        value = np.ascontiguousarray(value, dtype=np.float32)
        if "input_projection" in name:  # the converter forces Gemma 3's projection to F16
            w.add_tensor(name, value.astype(np.float16), raw_dtype=Q.F16)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
