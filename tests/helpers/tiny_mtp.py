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
  stored zero-centred as that family stores its norms;
- ``build_qwen3_next_target``: Qwen3-Next (``qwen3_next``: gated-delta and full-attention layers,
  mixture-of-experts MLPs stored per expert, norms zero-centred) with the same ``mtp.*`` layout;
- ``build_gemma4_assistant``: Google's Gemma 4 MTP assistant layout (``model_type:
  gemma4_assistant``; query-only Gemma 4 layers from mlx-lm's ``gemma4_text`` classes,
  ``pre_projection`` / ``post_projection``, the centroid head ``masked_embedding.*``) for a
  ``tiny_drafters.build_target(..., "gemma4")`` target.

``echo=True`` writes an MTP module that passes the target's hidden state straight through (the
decoder layer's output projections zeroed): it then predicts the token the target predicted
one position earlier, which a looping greedy stream accepts, so tests see accepted drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
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


def build_qwen35_target(out: Path, *, seed: int = 13, layers: int = 2, echo: bool = False,
                        logit_scale: float = 1.0, embed_scale: float = 1.0) -> Path:
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
    params["language_model.model.norm.weight"] = params["language_model.model.norm.weight"] * logit_scale
    params["language_model.model.embed_tokens.weight"] = params["language_model.model.embed_tokens.weight"] * embed_scale
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


def _zero_centre(weights: dict[str, mx.array], keys=(".input_layernorm.weight", ".post_attention_layernorm.weight",
                                                    "model.norm.weight", ".q_norm.weight", ".k_norm.weight")):
    """The Qwen3-Next family's checkpoint convention: these RMSNorm weights are stored as ``scale - 1``."""
    return {k: (v - 1.0 if v.ndim == 1 and k.endswith(keys) else v) for k, v in weights.items()}


def build_qwen3_next_target(out: Path, *, seed: int = 14, layers: int = 4, echo: bool = False,
                            logit_scale: float = 1.0) -> Path:
    """Qwen3-Next: every ``full_attention_interval`` (2) -th layer full attention, the rest gated-delta
    linear attention; every MLP a 4-expert MoE with a shared expert (as published, which is also what
    makes mlx-lm's loader drop the ``mtp.*`` weights)."""
    vocab = build_tokenizer(out)
    config = {**_common(vocab, layers), "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
              "head_dim": 16, "full_attention_interval": 2, "partial_rotary_factor": 0.25,
              "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
              "decoder_sparse_step": 1, "shared_expert_intermediate_size": 64, "mlp_only_layers": [],
              "moe_intermediate_size": 32, "norm_topk_prob": True, "tie_word_embeddings": False,
              "mtp_num_hidden_layers": 1}
    params = _params(config, layers + 1, seed)
    for name in params:
        if name.endswith("mlp.gate.weight"):  # a router that actually routes
            params[name] = mx.random.normal(params[name].shape) * 0.5
    params["model.norm.weight"] = params["model.norm.weight"] * logit_scale
    extra = f"model.layers.{layers}."
    if (layers + 1) % 2:  # the MTP layer is a full-attention layer: take the last full one if layer N is linear
        extra = f"model.layers.{layers - 1}."
    weights = {k: v for k, v in params.items() if not k.startswith(f"model.layers.{layers}.")}
    f = _fusion(seed, echo, zero_centred=True)
    block = _zero_centre(_block(params, extra, echo), keys=("input_layernorm.weight", "post_attention_layernorm.weight",
                                                            "q_norm.weight", "k_norm.weight"))
    weights = _zero_centre(weights)
    weights.update({"mtp.pre_fc_norm_embedding.weight": f["embed_norm"], "mtp.pre_fc_norm_hidden.weight": f["hidden_norm"],
                    "mtp.fc.weight": f["proj"], "mtp.norm.weight": f["final_norm"]})
    weights.update({"mtp.layers.0." + k: v for k, v in block.items()})
    return _write(out, config, _unstack_experts(weights))


def build_gemma4_assistant(out: Path, target_dir: Path, *, seed: int = 21, echo: bool = False, layers: int = 4,
                           centroids: int = 8, top_k: int = 2) -> Path:
    """A Gemma 4 assistant for the tiny gemma4 target in ``target_dir``. ``echo``: its hidden size is the
    target's, ``pre_projection`` passes the target's hidden through, the layers' residual writes are
    zeroed and the output table is the target's embedding table, so it drafts the token the target
    predicted one position earlier (which a greedy stream stuck on one token accepts); its centroid
    head then keeps every centroid, so it equals the dense head."""
    import numpy as np
    from mlx_lm.models import gemma4_text

    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    text_t = tcfg.get("text_config") or tcfg
    backbone, vocab = text_t["hidden_size"], tcfg.get("vocab_size") or text_t["vocab_size"]
    hidden = backbone if echo else 32
    types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    text = {"model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": layers,
            "intermediate_size": 2 * hidden, "num_attention_heads": 4, "head_dim": text_t["head_dim"],
            "global_head_dim": text_t["global_head_dim"], "num_key_value_heads": text_t["num_key_value_heads"],
            "num_kv_shared_layers": layers, "hidden_size_per_layer_input": 0, "vocab_size": vocab,
            "vocab_size_per_layer_input": vocab, "sliding_window": text_t["sliding_window"], "layer_types": types,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "final_logit_softcapping": None,
            "tie_word_embeddings": True}
    if echo:
        top_k = centroids
    config = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"],
              "backbone_hidden_size": backbone, "use_ordered_embeddings": True, "num_centroids": centroids,
              "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True, "text_config": text}
    mx.random.seed(seed)
    args = gemma4_text.ModelArgs.from_dict({**text})
    weights = {}
    for i in range(layers):
        layer = gemma4_text.DecoderLayer(args, i)
        for k, v in tree_flatten(layer.parameters()):
            weights[f"model.layers.{i}.{k}"] = v
    target = mx.load(str(Path(target_dir) / "model.safetensors"))
    table = next(v for k, v in target.items() if k.endswith("embed_tokens.weight"))
    if echo:
        for k in weights:
            if k.endswith(("o_proj.weight", "down_proj.weight")):
                weights[k] = mx.zeros_like(weights[k])
        weights["model.embed_tokens.weight"] = table
        weights["pre_projection.weight"] = mx.concatenate([mx.zeros((hidden, backbone)), mx.eye(hidden)], axis=1)
        weights["post_projection.weight"] = mx.eye(hidden)
    else:
        weights["model.embed_tokens.weight"] = mx.random.normal((vocab, hidden))
        weights["pre_projection.weight"] = mx.random.normal((hidden, 2 * backbone)) * (2 * backbone) ** -0.5
        weights["post_projection.weight"] = mx.random.normal((backbone, hidden)) * hidden ** -0.5
    weights["model.norm.weight"] = mx.ones((hidden,))
    weights["masked_embedding.centroids.weight"] = mx.random.normal((centroids, hidden)) * hidden ** -0.5
    order = np.random.default_rng(seed).permutation(vocab).astype(np.int64)
    out.mkdir(parents=True, exist_ok=True)
    floats = {k: v.astype(mx.float32) for k, v in weights.items()}
    floats["masked_embedding.token_ordering"] = mx.array(order)
    mx.save_safetensors(str(out / "model.safetensors"), floats, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
