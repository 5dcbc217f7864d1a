"""Tiny random Hugging Face checkpoints of every architecture mlxcel reads from GGUF.

Each ``ArchCase`` is one model family: the Hugging Face ``config.json`` a real checkpoint of it
carries (shrunk: 64 wide, 2-6 layers, a 384-token vocabulary), the mlx-lm class that runs it,
and ``to_hf``, which puts mlx-lm's parameters back in the checkpoint's layout (experts one
tensor each, convolution kernels as torch stores them, norms as the checkpoint holds them):
the inverse of mlx-lm's ``sanitize``. ``build(case, dir)`` draws the weights with mlx-lm's own
class (seeded), writes the checkpoint, and checks that mlx-lm loading it gives the same
parameters back, so the layout written here is the one mlx-lm (and the converter) reads.

``gguf_convert.convert`` then writes the GGUF llama.cpp's convert_hf_to_gguf would make of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

V = 384  # tiny_checkpoints.build_tokenizer's vocabulary
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=2048, rope_theta=10000.0,
            tie_word_embeddings=False, torch_dtype="float32")
Params = dict[str, mx.array]


def _cfg(**kw) -> dict:
    return {**BASE, **kw}


def _unstack(params: Params, names: dict[str, str], n_expert: int, where: str = "mlp") -> Params:
    """``{where}.switch_mlp.{mlx}`` (stacked) -> ``{where}.experts.{e}.{hf}``, one per expert."""
    out = {}
    for key, value in params.items():
        hit = next((m for m in names if f".{where}.switch_mlp.{m}." in key), None)
        if hit is None:
            out[key] = value
            continue
        for e in range(n_expert):
            out[key.replace(f".{where}.switch_mlp.{hit}.", f".{where}.experts.{e}.{names[hit]}.")] = value[e]
    return out


SWIGLU = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}


def _identity(params: Params, config: dict) -> Params:
    return dict(params)


def _mixtral(params: Params, config: dict) -> Params:
    return _unstack(params, {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}, config["num_local_experts"],
                    where="block_sparse_moe")


def _moe(params: Params, config: dict) -> Params:
    return _unstack(params, SWIGLU, config.get("num_experts") or config.get("n_routed_experts"))


def _granitemoe(params: Params, config: dict) -> Params:
    out = {}
    for key, value in params.items():
        if ".switch_mlp.gate_proj." in key:
            up = params[key.replace("gate_proj", "up_proj")]
            out[key.replace("switch_mlp.gate_proj", "input_linear")] = mx.concatenate([value, up], axis=1)
        elif ".switch_mlp.down_proj." in key:
            out[key.replace("switch_mlp.down_proj", "output_linear")] = value
        elif ".switch_mlp.up_proj." not in key:
            out[key] = value
    return out


def _conv_to_torch(value: mx.array) -> mx.array:
    """mlx Conv1d (C, K, 1) -> torch (C, 1, K)."""
    return value.transpose(0, 2, 1)


def _lfm2(params: Params, config: dict) -> Params:
    return {k: _conv_to_torch(v) if k.endswith("conv.conv.weight") else v for k, v in params.items()}


_ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                 ".q_norm.weight", ".k_norm.weight")


def _qwen3_next(params: Params, config: dict) -> Params:
    out = {}
    for k, v in _moe(params, config).items():
        if "conv1d.weight" in k:
            v = _conv_to_torch(v)
        elif k.endswith(_ZERO_CENTRED):
            v = v - 1.0  # the checkpoint's norms are 1-centred: mlx-lm adds the 1 in sanitize
        out[k] = v
    return out


def _qwen3_5(params: Params, config: dict) -> Params:
    """The multimodal checkpoint's layout, as Qwen3.5 ships: ``model.language_model.*`` and a
    top-level ``lm_head``."""
    config = config.get("text_config", config)
    out = {}
    for k, v in params.items():
        k = k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")
        if "conv1d.weight" in k:
            v = _conv_to_torch(v)
        elif k.endswith(_ZERO_CENTRED):
            v = v - 1.0
        out[k] = v
    if config.get("num_experts"):
        fused = {}
        for k, v in out.items():
            if ".switch_mlp.gate_proj." in k:
                up = out[k.replace("gate_proj", "up_proj")]
                fused[k.replace("switch_mlp.gate_proj.weight", "experts.gate_up_proj")] = mx.concatenate([v, up], axis=-2)
            elif ".switch_mlp.down_proj." in k:
                fused[k.replace("switch_mlp.down_proj.weight", "experts.down_proj")] = v
            elif ".switch_mlp.up_proj." not in k:
                fused[k] = v
        out = fused
    return out


def _deepseek_v3(params: Params, config: dict) -> Params:
    out = {}
    for k, v in _moe(params, config).items():
        if k.endswith("self_attn.embed_q.weight"):
            wv = params[k.replace("embed_q", "unembed_out")]  # (heads, v_head_dim, kv_lora)
            wk = v.swapaxes(-1, -2)  # (heads, nope, kv_lora)
            kv_b = mx.concatenate([wk, wv], axis=1)
            out[k.replace("embed_q", "kv_b_proj")] = kv_b.reshape(-1, kv_b.shape[-1])
        elif not k.endswith("self_attn.unembed_out.weight"):
            out[k] = v
    return out


def _gpt_oss(params: Params, config: dict) -> Params:
    """The bf16 Hugging Face layout: ``gate_up_proj`` (experts, hidden, 2 ff) with gate and up
    interleaved column by column, ``down_proj`` (experts, ff, hidden), biases beside them."""
    out = {}
    for k, v in params.items():
        if ".mlp.experts.gate_proj." in k:
            up = params[k.replace("gate_proj", "up_proj")]
            both = mx.stack([v, up], axis=-2 if k.endswith("weight") else -1)  # interleave rows / entries
            if k.endswith("weight"):
                fused = both.reshape(v.shape[0], 2 * v.shape[1], v.shape[2]).swapaxes(-1, -2)
                out[k.replace("experts.gate_proj.weight", "experts.gate_up_proj")] = fused
            else:
                out[k.replace("experts.gate_proj.bias", "experts.gate_up_proj_bias")] = both.reshape(v.shape[0], -1)
        elif ".mlp.experts.down_proj.weight" in k:
            out[k.replace("down_proj.weight", "down_proj")] = v.swapaxes(-1, -2)
        elif ".mlp.experts.down_proj.bias" in k:
            out[k.replace("down_proj.bias", "down_proj_bias")] = v
        elif ".mlp.experts.up_proj." not in k:
            out[k] = v
    return out


@dataclass(frozen=True)
class ArchCase:
    """One family: its test id, the GGUF architecture llama.cpp writes for it, the checkpoint
    config, and the mlx-lm -> checkpoint layout."""

    id: str
    gguf_arch: str
    config: dict
    to_hf: Callable[[Params, dict], Params] = _identity
    zero_centred_norms: bool = False  # mlx-lm's RMSNorm adds 1 to these weights (Gemma)
    reloads: bool = True  # whether mlx-lm's sanitize reads the checkpoint layout back
    notes: str = ""
    extra: dict = field(default_factory=dict)


QWEN35_ROPE = {"rope_type": "default", "mrope_section": [1, 1, 0], "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
LINEAR_ATTN = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_conv_kernel_dim=4, head_dim=16, full_attention_interval=2)

CASES: dict[str, ArchCase] = {c.id: c for c in [
    ArchCase("llama", "llama", _cfg(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False,
                                    mlp_bias=False)),
    ArchCase("mistral", "llama", _cfg(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=4096,
                                      head_dim=32)),
    ArchCase("mixtral", "llama", _cfg(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                                      num_experts_per_tok=2), _mixtral),
    ArchCase("qwen2", "qwen2", _cfg(model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True)),
    ArchCase("qwen3", "qwen3", _cfg(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32)),
    # the text model of Qwen2/2.5-VL: Qwen2's tensors, M-RoPE sections in the metadata (ordinary RoPE for text)
    ArchCase("qwen2vl", "qwen2vl", _cfg(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"],
                                        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                                        tie_word_embeddings=True),
             lambda params, config: {k.removeprefix("language_model."): v for k, v in params.items()}),
    ArchCase("qwen2moe", "qwen2moe", _cfg(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_experts=4,
                                          num_experts_per_tok=2, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=48), _moe),
    ArchCase("qwen3moe", "qwen3moe", _cfg(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                                          num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                                          moe_intermediate_size=32, head_dim=16, norm_topk_prob=True), _moe),
    ArchCase("gemma", "gemma", _cfg(model_type="gemma", architectures=["GemmaForCausalLM"], head_dim=16,
                                    tie_word_embeddings=True), zero_centred_norms=True),
    ArchCase("gemma2", "gemma2", _cfg(model_type="gemma2", architectures=["Gemma2ForCausalLM"], head_dim=16,
                                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                      query_pre_attn_scalar=16, sliding_window=4096, tie_word_embeddings=True),
             zero_centred_norms=True),
    ArchCase("gemma3", "gemma3", _cfg(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], head_dim=16,
                                      num_hidden_layers=6, query_pre_attn_scalar=16, sliding_window=8,
                                      sliding_window_pattern=6, rope_local_base_freq=100.0, rope_theta=1000000.0,
                                      tie_word_embeddings=True), zero_centred_norms=True),
    ArchCase("phi3", "phi3", _cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], max_position_embeddings=4096,
                                  original_max_position_embeddings=256,
                                  rope_scaling={"type": "longrope", "long_factor": [1.0 + 0.5 * i for i in range(8)],
                                                "short_factor": [1.0 + 0.1 * i for i in range(8)]})),
    ArchCase("phi4mini", "phi3", _cfg(model_type="phi3", architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.75,
                                      tie_word_embeddings=True)),
    ArchCase("olmo2", "olmo2", _cfg(model_type="olmo2", architectures=["Olmo2ForCausalLM"])),
    ArchCase("olmo3", "olmo2", _cfg(model_type="olmo3", architectures=["Olmo3ForCausalLM"], sliding_window=8,
                                    num_hidden_layers=4, rope_theta=500000.0)),
    ArchCase("granite", "granite", _cfg(model_type="granite", architectures=["GraniteForCausalLM"], logits_scaling=4.0,
                                        attention_multiplier=0.2, embedding_multiplier=6.0, residual_multiplier=0.5,
                                        attention_bias=False, mlp_bias=False)),
    ArchCase("granitemoe", "granitemoe", _cfg(model_type="granitemoe", architectures=["GraniteMoeForCausalLM"],
                                              logits_scaling=4.0, attention_multiplier=0.2, embedding_multiplier=6.0,
                                              residual_multiplier=0.5, attention_bias=False, num_local_experts=4,
                                              num_experts_per_tok=2), _granitemoe),
    ArchCase("starcoder2", "starcoder2", _cfg(model_type="starcoder2", architectures=["Starcoder2ForCausalLM"],
                                              norm_epsilon=1e-5, tie_word_embeddings=True)),
    ArchCase("gpt-oss", "gpt-oss", _cfg(model_type="gpt_oss", architectures=["GptOssForCausalLM"], head_dim=16,
                                        num_local_experts=4, num_experts_per_tok=2, sliding_window=8, num_hidden_layers=4,
                                        intermediate_size=64, layer_types=["sliding_attention", "full_attention"] * 2,
                                        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "original_max_position_embeddings": 256}),
             _gpt_oss, reloads=False),
    ArchCase("deepseek-v2", "deepseek2", _cfg(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"],
                                              moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
                                              num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=None,
                                              qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                                              first_k_dense_replace=1, num_key_value_heads=4, topk_method="greedy",
                                              scoring_func="softmax", routed_scaling_factor=1.5,
                                              rope_scaling={"type": "yarn", "factor": 1.0, "mscale": 1.0,
                                                            "mscale_all_dim": 0.0,
                                                            "original_max_position_embeddings": 2048}), _moe),
    ArchCase("deepseek-v3", "deepseek2", _cfg(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                                              moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=4,
                                              num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=48,
                                              qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                                              first_k_dense_replace=1, num_key_value_heads=4, n_group=2, topk_group=1,
                                              routed_scaling_factor=2.5, scoring_func="sigmoid", norm_topk_prob=True,
                                              topk_method="noaux_tc",
                                              rope_scaling={"type": "yarn", "factor": 4.0, "mscale": 1.0,
                                                            "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                                            "original_max_position_embeddings": 256}), _deepseek_v3),
    ArchCase("lfm2", "lfm2", _cfg(model_type="lfm2", architectures=["Lfm2ForCausalLM"], norm_eps=1e-5, conv_bias=False,
                                  conv_L_cache=3, block_dim=64, block_multiple_of=32, block_ffn_dim_multiplier=1.0,
                                  block_auto_adjust_ff_dim=True, block_ff_dim=192, num_hidden_layers=4,
                                  layer_types=["conv", "full_attention", "conv", "conv"], tie_word_embeddings=True,
                                  intermediate_size=192), _lfm2),
    ArchCase("qwen3next", "qwen3next", _cfg(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"],
                                            **LINEAR_ATTN, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                            shared_expert_intermediate_size=32, mlp_only_layers=[],
                                            moe_intermediate_size=32, partial_rotary_factor=0.25, num_hidden_layers=4,
                                            norm_topk_prob=True), _qwen3_next),
    ArchCase("qwen35", "qwen35", {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                                  "tie_word_embeddings": False,
                                  "text_config": _cfg(model_type="qwen3_5_text", **LINEAR_ATTN, num_hidden_layers=4,
                                                      rope_parameters=dict(QWEN35_ROPE))}, _qwen3_5),
    ArchCase("qwen35moe", "qwen35moe", {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                        "tie_word_embeddings": False,
                                        "text_config": _cfg(model_type="qwen3_5_moe_text", **LINEAR_ATTN,
                                                            num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
                                                            shared_expert_intermediate_size=32,
                                                            moe_intermediate_size=32,
                                                            rope_parameters=dict(QWEN35_ROPE))}, _qwen3_5),
    ArchCase("gemma3n", "gemma3n", {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
                                    "text_config": _cfg(
        model_type="gemma3n_text", head_dim=16, num_hidden_layers=4, num_kv_shared_layers=2, vocab_size_per_layer_input=V,
        sliding_window=8, rope_local_base_freq=10000.0, rope_theta=1000000.0, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"] * 2, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
        hidden_size_per_layer_input=8, altup_num_inputs=4, altup_coef_clip=120.0, altup_correct_scale=True,
        altup_active_idx=0, laurel_rank=8, rms_norm_eps=1e-6)}),
    ArchCase("smollm3", "smollm3", _cfg(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], num_hidden_layers=4,
                                        tie_word_embeddings=True, attention_bias=False, mlp_bias=False)),
    ArchCase("seed_oss", "seed_oss", _cfg(model_type="seed_oss", architectures=["SeedOssForCausalLM"], head_dim=16,
                                          attention_bias=True, attention_out_bias=False)),
    ArchCase("olmoe", "olmoe", _cfg(model_type="olmoe", architectures=["OlmoeForCausalLM"], num_experts=4,
                                    num_experts_per_tok=2, intermediate_size=32), _moe),
    ArchCase("ernie4_5", "ernie4_5", _cfg(model_type="ernie4_5", architectures=["Ernie4_5_ForCausalLM"], head_dim=16,
                                          use_bias=False, tie_word_embeddings=True)),
    ArchCase("exaone4", "exaone4", _cfg(model_type="exaone4", architectures=["Exaone4ForCausalLM"], head_dim=16,
                                        num_hidden_layers=4, sliding_window=8, sliding_window_pattern="LLLG",
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
             reloads=False, notes="transformers' Exaone4Config cannot read mlx-lm's 'LLLG' pattern"),
    ArchCase("llama3", "llama", _cfg(model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=False,
                                     mlp_bias=False, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                   "original_max_position_embeddings": 64})),
]}


def _randomize(params: Params, case: ArchCase, seed: int) -> Params:
    """Weights that make a wrong mapping show: norms away from 1, embeddings N(0, 1), every
    vector (biases, sinks, decay rates) non-zero."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in params.items():
        shape = value.shape
        if len(shape) == 1 and "norm" in name:
            base = 0.0 if case.zero_centred_norms else 1.0
            value = base + 0.3 * rng.standard_normal(shape)
        elif len(shape) == 1:
            value = 0.3 * rng.standard_normal(shape)
        elif name.endswith("embed_tokens.weight"):
            value = rng.standard_normal(shape)
        elif name.endswith("lm_head.weight"):
            value = 0.5 * rng.standard_normal(shape)
        else:
            fan_in = shape[-1]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        out[name] = mx.array(np.asarray(value, dtype=np.float32))
    return out


def mlx_params(case: ArchCase, seed: int = 0) -> Params:
    """float32 parameters of mlx-lm's class for ``case``, seeded."""
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(case.config)
    model = model_cls(args_cls.from_dict(case.config))
    return _randomize(dict(tree_flatten(model.parameters())), case, seed)


def build(case: ArchCase, out: Path, seed: int = 0) -> Path:
    """Write ``case``'s checkpoint (config.json, model.safetensors, tokenizer) to ``out``."""
    import tiny_checkpoints
    from mlx_lm.utils import load as mlx_lm_load

    out.mkdir(parents=True, exist_ok=True)
    tiny_checkpoints.build_tokenizer(out)
    params = mlx_params(case, seed)
    hf = case.to_hf(params, case.config)
    mx.save_safetensors(str(out / "model.safetensors"), {k: v.astype(mx.float32) for k, v in hf.items()},
                        metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(case.config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    mx.save_safetensors(str(out / "mlx_params.safetensors"), params)  # the parameters mlx-lm holds
    if case.reloads:
        model, _ = mlx_lm_load(str(out))
        loaded = dict(tree_flatten(model.parameters()))
        assert set(loaded) == set(params), sorted(set(loaded) ^ set(params))
        for name, value in params.items():
            assert mx.allclose(loaded[name], value, rtol=0, atol=1e-6), f"{case.id}: {name} does not round-trip"
    return out


def reference_model(case: ArchCase, hf_dir: Path):
    """mlx-lm's model for ``case`` holding the checkpoint's parameters."""
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(case.config)
    model = model_cls(args_cls.from_dict(case.config))
    model.load_weights(list(mx.load(str(hf_dir / "mlx_params.safetensors")).items()), strict=True)
    mx.eval(model.parameters())
    return model
