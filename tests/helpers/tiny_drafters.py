"""Tiny random checkpoints for the model-based drafter tests, written in the published on-disk
formats and read back by the real loaders.

Targets (``build_target``): ``qwen3`` and ``muse_glimmer`` (mlx-lm's own model classes, so the
target is a real mlx-lm model with its real caches; ``muse_glimmer`` has rotating sliding-window
caches, ``window`` tokens), plus the ``llama`` / ``qwen2`` of ``tiny_checkpoints``; the hybrid
targets, whose caches hold recurrent state: ``lfm2`` (LiquidAI's layout: short-convolution and
attention layers, ``embedding_norm``, conv weights ``[C, 1, K]``), ``qwen3_5`` and ``qwen3_next``
(``tiny_mtp``'s, with their MTP layers); and ``gemma4`` (Google's multimodal layout,
``model.language_model.*``, sliding and full attention, the last layers sharing K/V).

Drafters (config.json + model.safetensors, no embeddings and no LM head):

* ``build_dflash``: z-lab's DFlash layout (``architectures: ["DFlashDraftModel"]``, a
  ``dflash_config`` with ``target_layer_ids`` / ``mask_token_id`` / ``block_size``; tensors
  ``fc.weight``, ``hidden_norm.weight``, ``layers.N.*`` of a Qwen3 decoder layer, ``norm.weight``);
* ``build_dspark``: LiquidAI's LFM2 DSpark layout (``architectures: ["Lfm2DSparkDraftModel"]``,
  ``model_type: qwen3``, ``block_size`` counting proposals, ``dflash_config`` with the layer ids
  and mask token, ``markov_rank``; plus ``markov_head.markov_w1.weight`` / ``markov_w2.weight``);
* ``build_muse_assistant``: Meta's Muse Glimmer assistant layout (``model_type:
  muse_glimmer_assistant``, ``architectures: ["MuseGlimmerAssistantModel"]``, top-level
  ``target_layer_ids`` / ``mask_token_id`` / ``block_size``, sliding-attention layers; tensors
  ``encoder.fc.weight``, ``encoder.output_norm_enc.weight``, ``layers.N.*``, ``norm.weight``).

``fc`` mostly passes the last listed target layer through, so the drafter's context rows are
close to the target's own late hidden states; the layers are random. ``logit_scale`` scales the
final norms (a target's or a drafter's), hence how peaked p and q are.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import tiny_mtp
from mlx.utils import tree_flatten
from tiny_checkpoints import base_config, build_tokenizer, random_params, tiny_config


def _save(out: Path, config: dict, params: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    params = {k: v.astype(mx.float32) for k, v in params.items()}
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def build_target(out: Path, arch: str, *, seed: int = 0, layers: int = 4, hidden: int = 64,
                 window: int = 24, logit_scale: float = 1.0) -> Path:
    """A tiny ``arch`` target (``qwen3`` or ``muse_glimmer``; ``llama``/``qwen2`` too) with a tokenizer.
    ``logit_scale`` scales the final norm, hence the logits (small: a diffuse p)."""
    from mlx_lm.utils import _get_classes

    if arch == "qwen3_5":
        return tiny_mtp.build_qwen35_target(out, seed=seed, layers=layers, logit_scale=TIED_NORM * logit_scale,
                                            embed_scale=TIED_EMBED)
    if arch == "qwen3_next":
        return tiny_mtp.build_qwen3_next_target(out, seed=seed, layers=layers, logit_scale=logit_scale)
    if arch in ("lfm2", "gemma4"):
        return _build_hf_layout(out, arch, seed=seed, layers=layers, hidden=hidden, window=window,
                                logit_scale=logit_scale)
    vocab = build_tokenizer(out)
    if arch in ("llama", "qwen2"):
        config = tiny_config(arch, vocab, layers=layers, hidden=hidden)
    else:
        config = tiny_config("llama", vocab, layers=layers, hidden=hidden)
        config.pop("attention_bias", None)
        config.pop("mlp_bias", None)
        config["head_dim"] = hidden // config["num_attention_heads"]
        if arch == "qwen3":
            config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True)
        elif arch == "muse_glimmer":
            config.update(model_type="muse_glimmer", architectures=["MuseGlimmerForCausalLM"],
                          sliding_window=window, final_logit_softcapping=20.0, output_multiplier=0.5,
                          qk_scale_factor=1.0, post_norm_eps=1e-6)
        else:
            raise ValueError(arch)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name in list(params):
        if name.endswith("embed_tokens.weight"):
            params[name] = mx.random.normal(params[name].shape)
        elif name == "lm_head.weight":
            params[name] = mx.random.normal(params[name].shape) * (4.0 if arch == "muse_glimmer" else 0.5)
        elif arch == "muse_glimmer" and name.endswith("layernorm.weight"):
            params[name] = mx.random.normal(params[name].shape) * 0.1  # centred norms: 1 + weight
    params["model.norm.weight"] = params["model.norm.weight"] * logit_scale
    if config.get("tie_word_embeddings"):
        params.pop("lm_head.weight", None)
    _save(out, config, params)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": config["eos_token_id"]}))
    return out


# Tied-embedding targets with random weights repeat their last input token for ever (the residual
# stream is mostly that token's embedding, and the head is the same table). A small table and a
# larger final norm let the layers steer the logits while keeping their scale.
TIED_EMBED = 0.05
TIED_NORM = 20.0


def _build_hf_layout(out: Path, arch: str, *, seed: int, layers: int, hidden: int, window: int,
                     logit_scale: float) -> Path:
    """LFM2 and Gemma 4 targets, in the tensor names and shapes their published checkpoints use."""
    vocab = build_tokenizer(out)
    base = base_config(vocab, layers=layers, hidden=hidden)
    if arch == "lfm2":
        types = ["conv" if i % 2 == 0 else "full_attention" for i in range(layers)]
        config = {**base, "model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "norm_eps": 1e-5,
                  "conv_bias": False, "conv_L_cache": 3, "block_dim": hidden, "block_multiple_of": 16,
                  "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False, "block_ff_dim": 2 * hidden,
                  "layer_types": types, "tie_word_embeddings": True}
        params = random_params(config, seed)
        params["model.embed_tokens.weight"] = params["model.embed_tokens.weight"] * TIED_EMBED
        params["model.embedding_norm.weight"] = params["model.embedding_norm.weight"] * TIED_NORM * logit_scale
        # the published layout stores a short convolution's weight as [C, 1, K] (mlx-lm's loader transposes)
        params = {k: (v.transpose(0, 2, 1) if k.endswith("conv.conv.weight") else v) for k, v in params.items()}
    elif arch == "gemma4":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        text = {**base, "model_type": "gemma4_text", "head_dim": 16, "global_head_dim": 32, "num_kv_shared_layers": 2,
                "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": vocab, "sliding_window": window,
                "layer_types": types, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
                "use_double_wide_mlp": False, "rms_norm_eps": 1e-6}
        config = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
                  "vocab_size": vocab, "tie_word_embeddings": True, "eos_token_id": 2}
        params = random_params(config, seed)
        params = {k: v * TIED_EMBED if k.endswith("embed_tokens.weight") else v for k, v in params.items()}
        params["language_model.model.norm.weight"] = params["language_model.model.norm.weight"] * TIED_NORM * logit_scale
        params = {k.replace("language_model.model.", "model.language_model."): v for k, v in params.items()
                  if not k.endswith("lm_head.weight")}
    else:
        raise ValueError(arch)
    params.pop("lm_head.weight", None)
    _save(out, config, params)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return out


def _layer_params(rng_seed: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int) -> dict:
    mx.random.seed(rng_seed)

    def w(o, i, s=None):
        return mx.random.normal((o, i)) * (s if s is not None else i ** -0.5)

    return {
        "input_layernorm.weight": mx.ones((hidden,)),
        "post_attention_layernorm.weight": mx.ones((hidden,)),
        "self_attn.q_proj.weight": w(heads * head_dim, hidden),
        "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
        "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
        "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "self_attn.q_norm.weight": mx.ones((head_dim,)),
        "self_attn.k_norm.weight": mx.ones((head_dim,)),
        "mlp.gate_proj.weight": w(inter, hidden),
        "mlp.up_proj.weight": w(inter, hidden),
        "mlp.down_proj.weight": w(hidden, inter),
    }


def _text_config(target_dir: Path) -> dict:
    config = json.loads((Path(target_dir) / "config.json").read_text())
    return config.get("text_config") or config


def _backbone(target_dir: Path, layer_ids: list[int], *, layers: int, seed: int, head_dim: int | None = None,
              teacher: bool = True, logit_scale: float = 1.0) -> tuple[dict, dict]:
    """Shared shape + tensors of the three formats (HF names without a prefix)."""
    tcfg = _text_config(target_dir)
    hidden = tcfg["hidden_size"]
    heads, kv = tcfg["num_attention_heads"], tcfg["num_key_value_heads"]
    head_dim = head_dim or tcfg.get("head_dim") or hidden // heads
    inter = tcfg["intermediate_size"]
    shape = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
             "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": inter,
             "rms_norm_eps": 1e-5, "vocab_size": tcfg["vocab_size"], "max_position_embeddings": 2048,
             "hidden_act": "silu", "tie_word_embeddings": False}
    params: dict = {}
    for i in range(layers):
        for k, v in _layer_params(seed * 100 + i, hidden, heads, kv, head_dim, inter).items():
            params[f"layers.{i}.{k}"] = v
    mx.random.seed(seed)
    n = len(layer_ids)
    if teacher:
        # fc picks the last listed target layer's output (the others weigh little): the drafter sees
        # the target's own late hidden state and mostly agrees with it.
        fc = mx.random.normal((hidden, n * hidden)) * (0.05 / (n * hidden) ** 0.5)
        eye = mx.eye(hidden)
        fc = mx.concatenate([fc[:, : (n - 1) * hidden], fc[:, (n - 1) * hidden:] + eye], axis=1)
    else:
        fc = mx.random.normal((hidden, n * hidden)) * (n * hidden) ** -0.5
    params["fc.weight"] = fc
    params["hidden_norm.weight"] = mx.ones((hidden,))
    params["norm.weight"] = mx.ones((hidden,)) * logit_scale
    return shape, params


def build_dflash(out: Path, target_dir: Path, *, layer_ids=(1, 3), layers: int = 1, block_size: int = 8,
                 mask_token_id: int = 3, seed: int = 11, logit_scale: float = 1.0) -> Path:
    shape, params = _backbone(target_dir, list(layer_ids), layers=layers, seed=seed, logit_scale=logit_scale)
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **shape, "rope_theta": 10000.0,
              "block_size": block_size,
              "dflash_config": {"target_layer_ids": list(layer_ids), "mask_token_id": mask_token_id},
              "num_target_layers": _text_config(target_dir)["num_hidden_layers"]}
    return _save(out, config, params)


def build_dspark(out: Path, target_dir: Path, *, layer_ids=(1, 3), layers: int = 1, block_size: int = 5,
                 mask_token_id: int = 3, rank: int = 8, seed: int = 12, logit_scale: float = 1.0) -> Path:
    shape, params = _backbone(target_dir, list(layer_ids), layers=layers, seed=seed, logit_scale=logit_scale)
    vocab = shape["vocab_size"]
    mx.random.seed(seed + 1)
    params["markov_head.markov_w1.weight"] = mx.random.normal((vocab, rank)) * 0.3
    params["markov_head.markov_w2.weight"] = mx.random.normal((vocab, rank)) * 0.3
    tlayers = _text_config(target_dir)["num_hidden_layers"]
    config = {"architectures": ["Lfm2DSparkDraftModel"], "model_type": "qwen3", **shape,
              "rope_theta": 10000.0, "rope_is_neox_style": False, "block_size": block_size, "markov_rank": rank,
              "layer_types": ["full_attention"] * layers,
              "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids),
                                "num_target_layers": tlayers}}
    return _save(out, config, params)


def build_muse_assistant(out: Path, target_dir: Path, *, layer_ids=(1, 3), layers: int = 1, block_size: int = 8,
                         mask_token_id: int = 3, window: int = 24, seed: int = 13, logit_scale: float = 1.0) -> Path:
    shape, params = _backbone(target_dir, list(layer_ids), layers=layers, seed=seed, logit_scale=logit_scale)
    params["encoder.fc.weight"] = params.pop("fc.weight")
    params["encoder.output_norm_enc.weight"] = params.pop("hidden_norm.weight")
    config = {"architectures": ["MuseGlimmerAssistantModel"], "model_type": "muse_glimmer_assistant", **shape,
              "block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids),
              "layer_types": ["sliding_attention"] * layers, "sliding_window": window,
              "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    config.pop("tie_word_embeddings")
    return _save(out, config, params)
