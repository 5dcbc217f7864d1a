"""Write a tiny Hugging Face checkpoint (``tiny_archs``) as the GGUF llama.cpp's
convert_hf_to_gguf makes of it, for every architecture the loader maps.

What the converter does, per architecture, re-stated from reading it (``conversion/*.py`` in
the llama.cpp sources; nothing here is taken from its code):

- names: Hugging Face module paths through gguf's ``TensorNameMap`` (``map_tensor_name``);
- metadata: the common hyperparameters every text model writes, then each family's own;
- tensors: llama / Mixtral / Granite q and k rows permuted for interleaved RoPE; experts stacked
  into one tensor per projection; Gemma norms stored as ``1 + w``; Qwen3-Next's ``A_log`` stored
  as ``-exp(A_log)``, its fused ``in_proj_qkvz`` split into ``attn_qkv`` and ``attn_gate``,
  convolution kernels squeezed; Qwen3.5 value heads reordered from grouped to tiled; DeepSeek's
  ``kv_b_proj`` split into ``attn_k_b`` (transposed) and ``attn_v_b``; GPT-OSS gate/up
  de-interleaved; Granite-MoE's fused ``input_linear`` split.

``scripts/check_gguf_layout.py`` compares this writer with the real converter when the llama.cpp
sources are at hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import MODEL_ARCH_NAMES, GGUFWriter, TensorNameMap
from gguf import GGMLQuantizationType as Q

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
_ARCH = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}


def _find(config: dict, keys: list[str]):
    return next((config[k] for k in keys if config.get(k) is not None), None)


def _rope_parameters(config: dict) -> dict:
    """The converter's ``rope_parameters``: the config's (new style), or its ``rope_scaling`` with
    the global and local bases, rotary fraction and original context mirrored in."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "full_attention" in rope or "sliding_attention" in rope:
        return rope
    if (local := _find(config, ["rope_local_base_freq"])) is not None:
        rope["sliding_attention"] = {"rope_theta": local}
    if "rope_theta" not in rope and config.get("rope_theta") is not None:
        rope["rope_theta"] = config["rope_theta"]
    if "rope_type" not in rope and rope.get("type") is not None:
        rope["rope_type"] = rope["type"]
    if "partial_rotary_factor" not in rope and config.get("partial_rotary_factor") is not None:
        rope["partial_rotary_factor"] = config["partial_rotary_factor"]
    return rope


def common_hparams(w: GGUFWriter, config: dict, n_blocks: int) -> None:
    """What every text model writes (``TextModel.set_gguf_parameters``)."""
    w.add_block_count(n_blocks)
    if (n_ctx := _find(config, ["max_position_embeddings", "n_ctx", "n_positions"])) is not None:
        w.add_context_length(n_ctx)
    w.add_embedding_length(config["hidden_size"])
    if (n_ff := _find(config, ["intermediate_size", "n_inner"])) is not None:
        w.add_feed_forward_length(n_ff)
    w.add_head_count(config["num_attention_heads"])
    if (n_kv := config.get("num_key_value_heads")) is not None:
        w.add_head_count_kv(n_kv)
    rope = _rope_parameters(config)
    rope = rope.get("full_attention", rope) | {k: v for k, v in rope.items() if k == "sliding_attention"}
    if rope.get("rope_type") == "yarn" and rope.get("factor"):
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast), ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if key in rope:
                add(rope[key])
    elif rope.get("rope_type") == "linear" and rope.get("factor"):
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if "mrope_section" in rope:
        w.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    if (local := rope.get("sliding_attention", {}).get("rope_theta")) is not None:
        w.add_rope_freq_base_swa(local)
    if (eps := _find(config, ["rms_norm_eps", "norm_eps"])) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := _find(config, ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])) is not None:
        w.add_layer_norm_eps(eps)
    if (n := _find(config, ["num_local_experts", "num_experts", "n_routed_experts"])) is not None:
        w.add_expert_count(n)
    if (n := _find(config, ["num_experts_per_tok"])) is not None:
        w.add_expert_used_count(n)
    if (n := config.get("n_group")) is not None:
        w.add_expert_group_count(n)
    if (n := config.get("topk_group")) is not None:
        w.add_expert_group_used_count(n)
    if (fn := config.get("scoring_func")) is not None:
        import gguf

        w.add_expert_gating_func({"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
                                  "softmax": gguf.ExpertGatingFuncType.SOFTMAX}[fn])
    if (head_dim := config.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(0)


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _stack_experts(state: dict[str, np.ndarray], where: str, names: dict[str, str], merged: str) -> dict:
    """``{where}.experts.{e}.{hf}.weight`` -> one ``{merged}.{hf}.weight`` per layer."""
    out, groups = {}, {}
    for key, value in state.items():
        parts = key.split(".")
        if f".{where}.experts." in key and parts[-2] in names and parts[-3].isdigit():
            bid = int(parts[2])
            groups.setdefault((bid, parts[-2]), {})[int(parts[-3])] = value
        else:
            out[key] = value
    for (bid, hf), by_expert in groups.items():
        out[merged.format(bid=bid) + f".{names[hf]}.weight"] = np.stack([by_expert[e] for e in sorted(by_expert)])
    return out


# -- per-architecture tensor changes ----------------------------------------------------------
def _tensors_llama(state, config):
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    out = {}
    for key, value in state.items():
        if key.endswith(("q_proj.weight", "q_proj.bias")):
            value = _llama_permute(value, heads)
        elif key.endswith(("k_proj.weight", "k_proj.bias")):
            value = _llama_permute(value, kv)
        out[key] = value
    if config.get("num_local_experts"):  # Mixtral
        out = _stack_experts(out, "block_sparse_moe", {"w1": "w1", "w2": "w2", "w3": "w3"},
                             "layers.{bid}.feed_forward.experts")
    return out


def _tensors_moe(state, config):
    state = {k.removeprefix("language_model."): v for k, v in state.items()}
    return _stack_experts(state, "mlp", {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"},
                          "model.layers.{bid}.mlp.experts")


def _tensors_gemma(state, config, *, drop_head=True):
    out = {}
    for key, value in state.items():
        if drop_head and key == "lm_head.weight":
            continue
        out[key] = value + 1.0 if key.endswith("norm.weight") else value
    return out


def _tensors_granite(state, config):
    out = _tensors_llama({k: v for k, v in state.items() if "input_linear" not in k}, config)
    for key, value in state.items():
        if key.endswith("block_sparse_moe.input_linear.weight"):  # (experts, 2 ff, hidden): gate, then up
            bid, ff = int(key.split(".")[2]), value.shape[-2] // 2
            out[f"blk.{bid}.ffn_gate_exps.weight"] = value[..., :ff, :]
            out[f"blk.{bid}.ffn_up_exps.weight"] = value[..., ff:, :]
    return out


def _tensors_gpt_oss(state, config):
    out = {}
    for key, value in state.items():
        if key.endswith("self_attn.sinks"):
            out[key + ".weight"] = value
        elif key.endswith("experts.gate_up_proj"):  # (experts, hidden, 2 ff), gate/up interleaved
            both = value.swapaxes(-1, -2)
            out[key.replace("gate_up_proj", "gate_proj.weight")] = both[:, ::2, :]
            out[key.replace("gate_up_proj", "up_proj.weight")] = both[:, 1::2, :]
        elif key.endswith("experts.gate_up_proj_bias"):
            out[key.replace("gate_up_proj_bias", "gate_proj.bias")] = value[..., ::2]
            out[key.replace("gate_up_proj_bias", "up_proj.bias")] = value[..., 1::2]
        elif key.endswith("experts.down_proj"):
            out[key + ".weight"] = value.swapaxes(-1, -2)
        elif key.endswith("experts.down_proj_bias"):
            out[key.replace("down_proj_bias", "down_proj.bias")] = value
        else:
            out[key] = value
    return out


def _tensors_deepseek2(state, config):
    out = {}
    for key, value in _tensors_moe(state, config).items():
        if key.endswith("kv_b_proj.weight"):
            heads, nope, v = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
            kv_b = value.reshape(heads, nope + v, value.shape[-1])
            out[key.replace("kv_b_proj", "k_b_proj")] = kv_b[:, :nope].swapaxes(1, 2)
            out[key.replace("kv_b_proj", "v_b_proj")] = kv_b[:, nope:]
        else:
            out[key.replace("e_score_correction_bias", "e_score_correction.bias")] = value
    return out


def _tensors_lfm2(state, config):
    return {k: v.squeeze(1) if "conv.conv" in k else v for k, v in state.items()}


def _tiled_from_grouped(x: np.ndarray, axis: int, n_k: int, per_k: int, head_dim: int) -> np.ndarray:
    """The converter's value-head reorder (Qwen3.5): grouped by key head -> tiled."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [n_k, per_k, head_dim] + shape[axis + 1:])
    return np.swapaxes(x, axis, axis + 1).reshape(shape)


def _reorder_value_heads(state, config):
    n_k, n_v = config["linear_num_key_heads"], config["linear_num_value_heads"]
    if n_k == n_v:
        return state
    dk, dv, per_k = config["linear_key_head_dim"], config["linear_value_head_dim"], n_v // n_k
    qk = 2 * n_k * dk
    out = {}
    for key, x in state.items():
        if "linear_attn." in key:
            if ".in_proj_qkv." in key:
                x = np.concatenate([x[:qk], _tiled_from_grouped(x[qk:], 0, n_k, per_k, dv)])
            elif ".in_proj_z." in key:
                x = _tiled_from_grouped(x, 0, n_k, per_k, dv)
            elif ".in_proj_b." in key or ".in_proj_a." in key:
                x = _tiled_from_grouped(x, 0, n_k, per_k, 1)
            elif key.endswith((".A_log", ".dt_bias")):
                x = _tiled_from_grouped(x[:, None], 0, n_k, per_k, 1)[:, 0]
            elif ".conv1d" in key:
                x = x.squeeze()
                x = np.concatenate([x[:qk], _tiled_from_grouped(x[qk:], 0, n_k, per_k, dv)])
            elif ".out_proj." in key:
                x = _tiled_from_grouped(x, 1, n_k, per_k, dv)
        out[key] = x
    return out


def _tensors_qwen3next(state, config):
    out = {}
    for key, x in state.items():
        if key.endswith("mlp.experts.gate_up_proj"):  # fused experts (Qwen3.5-MoE checkpoints)
            ff = x.shape[-2] // 2
            out[key.replace("gate_up_proj", "gate_proj.weight")] = x[..., :ff, :]
            out[key.replace("gate_up_proj", "up_proj.weight")] = x[..., ff:, :]
            continue
        if key.endswith("mlp.experts.down_proj"):
            out[key + ".weight"] = x
            continue
        if key.endswith(".A_log"):
            x = -np.exp(x)
        elif key.endswith(".dt_bias"):
            key = key.replace(".dt_bias", ".dt_proj.bias")
        elif "conv1d" in key:
            x = x.squeeze()
        elif key.endswith("norm.weight") and not key.endswith("linear_attn.norm.weight"):
            x = x + 1.0
        if "in_proj_qkvz.weight" in key:
            n_k, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
            per_k_v = config["linear_num_value_heads"] // n_k * config["linear_value_head_dim"]
            groups = x.reshape(n_k, 2 * dk + 2 * per_k_v, x.shape[-1])
            q, k = groups[:, :dk], groups[:, dk:2 * dk]
            v, z = groups[:, 2 * dk:2 * dk + per_k_v], groups[:, 2 * dk + per_k_v:]
            bid = int(key.split(".")[2])
            out[f"blk.{bid}.attn_qkv.weight"] = np.concatenate([t.reshape(-1, x.shape[-1]) for t in (q, k, v)])
            out[f"blk.{bid}.attn_gate.weight"] = z.reshape(-1, x.shape[-1])
            continue
        out[key] = x
    return _tensors_moe(out, config)


def _tensors_gemma3n(state, config):
    out, stacks = {}, {}
    for key, value in state.items():
        key = key.replace("language_model.", "")
        if key.endswith("_scale"):
            key += ".weight"
        parts = key.split(".")
        if parts[1] in ("altup_projections", "altup_unembed_projections"):
            stacks.setdefault(parts[1], {})[int(parts[2])] = value
            continue
        out[key] = value  # Gemma 3n's norms are stored as they are
    for name, by_index in stacks.items():
        out[f"model.{name}.weight"] = np.stack([by_index[i] for i in sorted(by_index)])
    return out


TENSOR_CHANGES = {
    "smollm3": _tensors_llama,
    "olmoe": _tensors_moe,
    "gemma3n": _tensors_gemma3n,
    "qwen3next": _tensors_qwen3next,
    "qwen35": lambda s, c: _tensors_qwen3next(_reorder_value_heads(s, c), c),
    "qwen35moe": lambda s, c: _tensors_qwen3next(_reorder_value_heads(s, c), c),
    "lfm2": _tensors_lfm2,
    "gpt-oss": _tensors_gpt_oss,
    "deepseek2": _tensors_deepseek2,
    "granite": _tensors_granite,
    "granitemoe": _tensors_granite,
    "gemma": _tensors_gemma,
    "gemma2": _tensors_gemma,
    "gemma3": lambda s, c: _tensors_gemma(s, c, drop_head=False),
    "llama": _tensors_llama,
    "qwen2moe": _tensors_moe,
    "qwen3moe": _tensors_moe,
}


# -- per-architecture metadata ----------------------------------------------------------------
def _hparams_llama(w, config):
    if config.get("head_dim") is None and config.get("model_type") == "llama":
        # transformers' LlamaConfig always has a head_dim, which the common keys then write
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(config["vocab_size"])
    w.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _hparams_qwen2moe(w, config):
    w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config.get("shared_expert_intermediate_size") is not None:
        w.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _hparams_gemma(w, config, *, version=1):
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_file_type(0)
    if version == 2:
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
        w.add_sliding_window(config["sliding_window"])


def _hparams_gemma3(w, config):
    # after the common ones (the writer keeps the last value of a repeated key)
    if config.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
    if config.get("sliding_window_pattern") != 1:
        w.add_sliding_window(config["sliding_window"])


def _hparams_exaone4(w, config):
    w.add_vocab_size(config["vocab_size"])
    if config.get("sliding_window") is not None:
        w.add_sliding_window(config["sliding_window"])
        if "layer_types" in config:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])
        elif isinstance(config.get("sliding_window_pattern"), str):
            p = config["sliding_window_pattern"]
            w.add_sliding_window_pattern([p[i % len(p)] == "L" for i in range(config["num_hidden_layers"])])


def _extra_llama3_rope(config):
    """``rope_freqs``: the per-frequency divisors of Llama 3 style scaling (``generate_extra_tensors``)."""
    import math

    rope = _rope_parameters(config)
    if str(rope.get("rope_type", "")).lower() != "llama3":
        return
    base = rope.get("rope_theta", 10000.0)
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    yield "rope_freqs.weight", np.array(out, dtype=np.float32)


def _hparams_phi3(w, config):
    n_embd, n_head = config["hidden_size"], config["num_attention_heads"]
    rope = _rope_parameters(config)
    orig = config.get("original_max_position_embeddings", 4096)  # transformers' Phi3Config default
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head
    w.add_context_length(config["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_head_count(n_head)
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_file_type(0)
    w.add_sliding_window(config.get("sliding_window") or 0)
    if rope.get("long_factor"):
        import math

        scale = config["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)


def _extra_phi3(config):
    rope = _rope_parameters(config)
    if rope.get("long_factor"):
        yield "rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32)
        yield "rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32)


def _hparams_olmo2(w, config):
    if "sliding_window" in config:
        # transformers' Olmo3Config gives its sliding layers the global RoPE base, which the common keys write
        w.add_rope_freq_base_swa(config["rope_theta"])
        w.add_sliding_window(config["sliding_window"])
        if "layer_types" in config:
            pattern = [t == "sliding_attention" for t in config["layer_types"]]
        else:
            pattern = [(i + 1) % 4 != 0 for i in range(config["num_hidden_layers"])]
        w.add_sliding_window_pattern(pattern)


def _hparams_granite(w, config):
    _hparams_llama(w, config)
    w.add_attention_scale(config["attention_multiplier"])
    w.add_embedding_scale(config["embedding_multiplier"])
    w.add_residual_scale(config["residual_multiplier"])
    w.add_logit_scale(config["logits_scaling"])


def _hparams_gpt_oss(w, config):
    w.add_sliding_window(config["sliding_window"])
    w.add_expert_feed_forward_length(config["intermediate_size"])


def _hparams_deepseek2(w, config):
    rope = _rope_parameters(config)
    first_dense = config.get("first_k_dense_replace", 0 if config.get("n_routed_experts") else config["num_hidden_layers"])
    w.add_leading_dense_block_count(first_dense)
    kv_lora = config.get("kv_lora_rank", 512)
    w.add_vocab_size(config["vocab_size"])
    if config.get("q_lora_rank") is not None:
        w.add_q_lora_rank(config["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + config["qk_rope_head_dim"])
    w.add_value_length(kv_lora)
    w.add_key_length_mla(config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    w.add_value_length_mla(config["v_head_dim"])
    w.add_expert_feed_forward_length(config.get("moe_intermediate_size") or config["intermediate_size"])
    if config.get("n_routed_experts") is not None:
        w.add_expert_count(config["n_routed_experts"])
    w.add_expert_shared_count(config.get("n_shared_experts", 0))
    if config.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(config["qk_rope_head_dim"])
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _hparams_lfm2(w, config):
    w.add_head_count_kv([config["num_key_value_heads"] if t != "conv" else 0 for t in config["layer_types"]])
    w.add_vocab_size(config["vocab_size"])
    w.add_shortconv_l_cache(config["conv_L_cache"])
    w.add_layer_norm_rms_eps(config["norm_eps"])
    ff = config.get("block_ff_dim") or config["intermediate_size"]
    if config["block_auto_adjust_ff_dim"]:
        ff = int(2 * ff / 3)
        if config.get("block_ffn_dim_multiplier") is not None:
            ff = int(config["block_ffn_dim_multiplier"] * ff)
        m = config["block_multiple_of"]
        ff = m * ((ff + m - 1) // m)
    w.add_feed_forward_length(ff)


def _hparams_qwen3next(w, config):
    _hparams_qwen2moe(w, config) if config.get("moe_intermediate_size") else None
    w.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    w.add_ssm_state_size(config["linear_key_head_dim"])
    w.add_ssm_group_count(config["linear_num_key_heads"])
    w.add_ssm_time_step_rank(config["linear_num_value_heads"])
    w.add_ssm_inner_size(config["linear_value_head_dim"] * config["linear_num_value_heads"])
    # transformers turns full_attention_interval into layer_types, which the converter writes as
    # recurrent_layers; the interval itself is then written as its default
    interval = config.get("full_attention_interval", 4)
    w.add_array(f"{w.arch}.attention.recurrent_layers", [(i + 1) % interval != 0 for i in range(config["num_hidden_layers"])])
    w.add_full_attention_interval(4)
    rope = _rope_parameters(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.25)))


def _hparams_qwen35(w, config):
    _hparams_qwen3next(w, config)
    if "mrope_section" not in _rope_parameters(config):
        w.add_rope_dimension_sections([11, 11, 10, 0])


def _hparams_gemma3n(w, config):
    from statistics import NormalDist

    _hparams_gemma3(w, config)
    w.add_altup_active_idx(config["altup_active_idx"])
    w.add_altup_num_inputs(config["altup_num_inputs"])
    w.add_embedding_length_per_layer_input(config["hidden_size_per_layer_input"])
    w.add_shared_kv_layers(config["num_kv_shared_layers"])
    w.add_activation_sparsity_scale([NormalDist().inv_cdf(p) if 0 < p < 1 else float("-inf")
                                     for p in config["activation_sparsity_pattern"]])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])


HPARAMS = {
    "exaone4": _hparams_exaone4,
    "smollm3": _hparams_llama,
    "olmoe": lambda w, c: w.add_layer_norm_rms_eps(1e-5),
    "gemma3n": _hparams_gemma3n,
    "qwen3next": _hparams_qwen3next,
    "qwen35": _hparams_qwen35,
    "qwen35moe": _hparams_qwen35,
    "lfm2": _hparams_lfm2,
    "gpt-oss": _hparams_gpt_oss,
    "deepseek2": _hparams_deepseek2,
    "phi3": _hparams_phi3,
    "olmo2": _hparams_olmo2,
    "granite": _hparams_granite,
    "granitemoe": _hparams_granite,
    "gemma": _hparams_gemma,
    "gemma2": lambda w, c: _hparams_gemma(w, c, version=2),
    "gemma3": _hparams_gemma3,
    "llama": _hparams_llama,
    "qwen2moe": _hparams_qwen2moe,
    "qwen3moe": _hparams_qwen2moe,
}
# architectures whose converter writes its own hyperparameters instead of the common ones
OWN_HPARAMS: set[str] = {"gemma", "gemma2", "phi3"}
# tensors the converter generates from the config (generate_extra_tensors)
EXTRA_TENSORS = {"phi3": _extra_phi3, "exaone4": _extra_llama3_rope, "llama": _extra_llama3_rope}


def write_vocab(w: GGUFWriter, hf_dir: Path, pre: str = "gpt-2") -> None:
    """The byte-level BPE vocabulary of ``tiny_checkpoints.build_tokenizer``, as ``_set_vocab_gpt2``."""
    tok_json = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = dict(tok_json["model"]["vocab"])
    special = {t["content"] for t in tok_json.get("added_tokens", []) if t.get("special")}
    for t in tok_json.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]])
    w.add_eos_token_id(vocab[tok_config["eos_token"]])
    w.add_pad_token_id(vocab[tok_config["pad_token"]])
    w.add_add_bos_token(False)
    w.add_chat_template(tok_config["chat_template"])


def hf_state(hf_dir: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}


def convert(hf_dir: Path, out: Path, arch: str, *, qtype: Q = Q.F32, extra_kv: dict | None = None,
            drop: tuple[str, ...] = (), pre: str = "gpt-2", write_as: str | None = None,
            fuse_qkv: bool = False) -> Path:
    """The GGUF of the checkpoint in ``hf_dir`` as llama.cpp's converter writes architecture
    ``arch`` (tensors as F32, or ``qtype`` for matrices whose rows allow it). For the refusal
    tests: ``extra_kv`` adds (or overrides) metadata (``{arch}.`` keys as ``name -> value``; ints,
    floats, bools, strings), ``drop`` leaves out tensors whose GGUF name contains one of the
    fragments, ``pre`` names the pre-tokenizer, ``write_as`` labels the file (general.architecture
    and the metadata prefix) as another architecture than the one it is laid out as; ``fuse_qkv``
    is the converter's ``--fuse-qkv`` (q, k and v rows stacked into ``attn_qkv``, after the q/k
    permutation)."""
    from gguf import quants

    config = json.loads((hf_dir / "config.json").read_text())
    config = {**config, **config.get("text_config", {})}
    if arch in ("granite", "granitemoe"):
        config.pop("head_dim", None)  # the converter ignores Granite's head_dim
    if arch == "deepseek2":
        config = {**config, "num_key_value_heads": 1}  # MLA written as one shared latent head
    n_blocks = config["num_hidden_layers"]
    w = GGUFWriter(str(out), write_as or arch)
    w.add_string("general.name", f"tiny-{arch}")
    if arch not in OWN_HPARAMS:
        common_hparams(w, config, n_blocks)
    if arch in HPARAMS:
        HPARAMS[arch](w, config)
    for key, value in (extra_kv or {}).items():
        add = {bool: w.add_bool, int: w.add_uint32, float: w.add_float32, str: w.add_string}[type(value)]
        add(key if key.startswith(("general.", "tokenizer.")) else f"{write_as or arch}.{key}", value)
    write_vocab(w, hf_dir, pre)

    # the converter's own renames before anything else (TextModel.filter_tensors)
    state = {k.replace("language_model.", ""): v for k, v in hf_state(hf_dir).items()}
    state = TENSOR_CHANGES.get(arch, lambda s, c: s)(state, config)
    state.update(dict(EXTRA_TENSORS.get(arch, lambda c: ())(config)))
    tmap = TensorNameMap(_ARCH[arch], n_blocks)
    named = {}
    for name, value in state.items():
        gguf_name = name if name.startswith(("blk.", "token_embd", "output", "rope_")) else tmap.get_name(
            name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{arch}: cannot map {name!r}")
        named[gguf_name] = value
    if fuse_qkv:
        for bid in range(n_blocks):
            for suffix in ("weight", "bias"):
                parts = [f"blk.{bid}.attn_{p}.{suffix}" for p in "qkv"]
                if all(p in named for p in parts):
                    named[f"blk.{bid}.attn_qkv.{suffix}"] = np.concatenate([named.pop(p) for p in parts])
    for gguf_name, value in named.items():
        if any(fragment in gguf_name for fragment in drop):
            continue
        value = np.ascontiguousarray(value, dtype=np.float32)
        if qtype != Q.F32 and value.ndim >= 2 and value.shape[-1] % 32 == 0:
            w.add_tensor(gguf_name, quants.quantize(value, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
