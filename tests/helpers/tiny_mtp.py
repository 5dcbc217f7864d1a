"""Tiny random targets carrying MTP layers, and a separate MTP assistant, in the published layouts.

Each writer builds an mlx-lm model of the target's family with one decoder layer more than the
target has, keeps the first ``N`` layers as the target and writes the extra one as the MTP
module's decoder layer under the layout's real tensor names (plus the fusion weights), with the
config keys the format uses:

- ``build_mimo_target``: MiMo (``model_type: mimo``), ``model.mtp_layers.0.*``;
- ``build_glm_target``: GLM-4.5 (``glm4_moe``, dense layers), DeepSeek-style
  ``model.layers.{N}.{enorm,hnorm,eh_proj,shared_head.norm,...}`` with ``num_nextn_predict_layers``;
- ``build_nextn_assistant``: SGLang's NextN export of that layer (its own config.json with
  ``num_hidden_layers: 1``, ``architectures: [Glm4MoeForCausalLMNextN]``, weights renamed to
  ``model.layers.0.*``, embeddings and head left out);
- ``build_qwen35_target``: Qwen3.5 (``qwen3_5``: a linear-attention layer then a full-attention
  one, tied embeddings) with ``mtp.fc``, ``mtp.pre_fc_norm_*``, ``mtp.layers.0.*``, ``mtp.norm``
  stored zero-centred as that family stores its norms. (Its recurrent layer's cache cannot be
  rewound, so this target loads and binds but cannot be speculated on.)

``echo=True`` writes an MTP module that passes the target's hidden state straight through (the
decoder layer's output projections zeroed): it then predicts the token the target predicted
one position earlier, which a looping greedy stream accepts, so tests see accepted drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from tiny_checkpoints import base_config, build_tokenizer, random_params

HIDDEN = 64


def _common(vocab: int, layers: int) -> dict:
    return base_config(vocab, layers=layers, hidden=HIDDEN)


def _params(config: dict, layers: int, seed: int, head_scale: float = 1.0) -> dict[str, mx.array]:
    """Parameters of an mlx-lm model of ``config``'s family with ``layers`` decoder layers."""
    cfg = json.loads(json.dumps(config))
    (cfg.get("text_config") or cfg)["num_hidden_layers"] = layers
    return random_params(cfg, seed, head_scale)


def _fusion(seed: int, echo: bool, zero_centred: bool = False) -> dict[str, mx.array]:
    """embed_norm, hidden_norm, proj [H, 2H] (embedding half first), final_norm."""
    mx.random.seed(seed + 1000)
    one = 0.0 if zero_centred else 1.0
    if echo:
        proj = mx.concatenate([mx.zeros((HIDDEN, HIDDEN)), mx.eye(HIDDEN)], axis=1)
        norms = [mx.full((HIDDEN,), one) for _ in range(3)]
    else:
        proj = mx.random.normal((HIDDEN, 2 * HIDDEN)) * (2 * HIDDEN) ** -0.5
        norms = [one + 0.1 * mx.random.normal((HIDDEN,)) for _ in range(3)]
    return {"embed_norm": norms[0], "hidden_norm": norms[1], "proj": proj, "final_norm": norms[2]}


def _block(params: dict[str, mx.array], prefix: str, echo: bool) -> dict[str, mx.array]:
    """The decoder layer under ``prefix``, relative names; ``echo`` zeroes its residual writes."""
    block = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
    if echo:
        for name in block:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                block[name] = mx.zeros_like(block[name])
    return block


def _write(out: Path, config: dict, weights: dict[str, mx.array], name: str = "model.safetensors") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / name), {k: v.astype(mx.float32) for k, v in weights.items()},
                        metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return out


def build_mimo_target(out: Path, *, seed: int = 11, layers: int = 2, echo: bool = False) -> Path:
    vocab = build_tokenizer(out)
    config = {**_common(vocab, layers), "model_type": "mimo", "architectures": ["MiMoForCausalLM"],
              "tie_word_embeddings": False, "num_nextn_predict_layers": 1}
    params = _params(config, layers + 1, seed)
    extra = f"model.layers.{layers}."
    weights = {k: v for k, v in params.items() if not k.startswith(extra)}
    f = _fusion(seed, echo)
    p = "model.mtp_layers.0."
    # MiMo concatenates [hidden, embedding]: the hidden half of the projection comes first.
    proj = mx.concatenate([f["proj"][:, HIDDEN:], f["proj"][:, :HIDDEN]], axis=1)
    weights.update({p + "token_layernorm.weight": f["embed_norm"], p + "hidden_layernorm.weight": f["hidden_norm"],
                    p + "input_proj.weight": proj, p + "final_layernorm.weight": f["final_norm"]})
    weights.update({p + k: v for k, v in _block(params, extra, echo).items()})
    return _write(out, config, weights)


def glm_config(vocab: int, layers: int, moe: bool = False) -> dict:
    return {**_common(vocab, layers), "model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"],
            "head_dim": 16, "partial_rotary_factor": 0.5, "use_qk_norm": False, "attention_bias": True,
            "tie_word_embeddings": False, "rope_scaling": None,
            "n_routed_experts": 4, "n_shared_experts": 1, "moe_intermediate_size": 32, "num_experts_per_tok": 2,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
            # dense: every layer, the MTP layer at index N included; moe: all but layer 0
            "first_k_dense_replace": 1 if moe else layers + 8, "num_nextn_predict_layers": 1}


def _unstack_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm's stacked ``switch_mlp.{proj}.weight [E, ...]`` back to the published per-expert
    ``experts.{e}.{proj}.weight``."""
    out = {}
    for k, v in weights.items():
        if ".switch_mlp." in k:
            head, tail = k.split(".switch_mlp.")
            for e in range(v.shape[0]):
                out[f"{head}.experts.{e}.{tail}"] = v[e]
        else:
            out[k] = v
    return out


def _nextn_layer(params: dict[str, mx.array], layers: int, seed: int, echo: bool, prefix: str) -> dict[str, mx.array]:
    f = _fusion(seed, echo)
    out = {prefix + "enorm.weight": f["embed_norm"], prefix + "hnorm.weight": f["hidden_norm"],
           prefix + "eh_proj.weight": f["proj"], prefix + "shared_head.norm.weight": f["final_norm"]}
    out.update({prefix + k: v for k, v in _block(params, f"model.layers.{layers}.", echo).items()})
    return out


def build_glm_target(out: Path, *, seed: int = 12, layers: int = 2, echo: bool = False,
                     head_scale: float = 1.0, moe: bool = False) -> Path:
    """``head_scale`` < 1 flattens the target's distributions (the distribution tests want a
    target whose greedy stream is far from a sample). ``moe``: layers from 1 on, the MTP layer
    included, are mixture-of-experts layers, written per expert as GLM-4.5 stores them."""
    vocab = build_tokenizer(out)
    config = glm_config(vocab, layers, moe)
    params = _params(config, layers + 1, seed, head_scale)
    for name in params:
        if name.endswith("mlp.gate.weight"):  # a router that actually routes
            params[name] = mx.random.normal(params[name].shape) * 0.5
    extra = f"model.layers.{layers}."
    weights = {k: v for k, v in params.items() if not k.startswith(extra)}
    weights.update(_nextn_layer(params, layers, seed, echo, extra))
    # DeepSeek-V3's MTP layer also carries its own copies of the shared tables.
    weights[extra + "embed_tokens.weight"] = params["model.embed_tokens.weight"]
    weights[extra + "shared_head.head.weight"] = params["lm_head.weight"]
    return _write(out, config, _unstack_experts(weights))


def build_nextn_assistant(out: Path, target_dir: Path) -> Path:
    """What SGLang's NextN export makes of ``target_dir``'s MTP layer."""
    config = json.loads((target_dir / "config.json").read_text())
    n = config["num_hidden_layers"]
    source = mx.load(str(target_dir / "model.safetensors"))
    prefix = f"model.layers.{n}."
    weights = {"model.layers.0." + k[len(prefix):]: v for k, v in source.items()
               if k.startswith(prefix) and "embed_tokens" not in k and "shared_head.head" not in k}
    config = {**config, "num_hidden_layers": 1, "architectures": ["Glm4MoeForCausalLMNextN"]}
    return _write(out, config, weights, name="nextn_layer_parameters.safetensors")


def build_qwen35_target(out: Path, *, seed: int = 13, layers: int = 2, echo: bool = False) -> Path:
    vocab = build_tokenizer(out)
    text = {**_common(vocab, layers), "model_type": "qwen3_5_text", "head_dim": 16, "full_attention_interval": 2,
            "num_experts": 0, "tie_word_embeddings": True, "mtp_num_hidden_layers": 1,
            "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
              "tie_word_embeddings": True, "vocab_size": vocab, "max_position_embeddings": 2048,
              "eos_token_id": 2}
    params = _params(config, layers, seed)
    params.pop("language_model.lm_head.weight", None)
    weights = {k.replace("language_model.model.", "model.language_model."): v for k, v in params.items()}
    f = _fusion(seed, echo, zero_centred=True)
    # The MTP layer is a full-attention layer: take one (index 1) from a second instance.
    block = _block(_params(config, layers, seed + 1), "language_model.model.layers.1.", echo)
    # This family stores every RMSNorm as (scale - 1).
    block = {k: (v - 1.0 if v.ndim == 1 and k.endswith("norm.weight") else v) for k, v in block.items()}
    weights.update({"mtp.pre_fc_norm_embedding.weight": f["embed_norm"], "mtp.pre_fc_norm_hidden.weight": f["hidden_norm"],
                    "mtp.fc.weight": f["proj"], "mtp.norm.weight": f["final_norm"]})
    weights.update({"mtp.layers.0." + k: v for k, v in block.items()})
    return _write(out, config, weights)
