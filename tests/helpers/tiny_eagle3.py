"""Tiny random EAGLE-3 drafters for a tiny target (``tiny_drafters.build_target``), written in each
real on-disk form and read back by the real loaders.

* ``build_eagle3(..., layout="eagle3")``: the EAGLE-3 authors' layout: a Llama config.json with
  ``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size`` and (optionally)
  ``eagle_aux_hidden_state_layer_ids``; tensors ``midlayer.*`` (the decoder layer, q/k/v reading
  ``2H``, plus ``hidden_norm``), ``fc.weight`` ``[H, 3H]``, ``norm.weight``, ``lm_head.weight``
  over the draft vocabulary, ``d2t`` (int64 offsets) and ``t2d`` (bool over the target vocabulary);
* ``layout="speculators"``: RedHatAI's speculators layout: ``architectures: ["Eagle3Speculator"]``,
  ``speculators_config`` (algorithm eagle3, a greedy proposal method with ``speculative_tokens``),
  the layer's Llama fields in ``transformer_layer_config``; tensors under ``layers.0.*``;
* ``write_eagle3_gguf``: the GGUF llama.cpp's converter makes of a directory written above
  (architecture ``eagle3``, llama.cpp tensor names, q/k rows permuted, ``d2t`` as absolute ids,
  ``eagle3.target_layers`` resolved against the target).

The draft vocabulary is a seeded subset of the target's (``draft_vocab`` ids, sorted as the real
maps are), or the whole of it (``draft_vocab=None``: no maps). ``logit_scale`` scales the final
norm, hence how peaked q is. ``echo=True`` writes a drafter whose layer passes the fused state
straight through (its residual writes zeroed), ``fc`` picking the last listed target layer and the
head copying the target's: it then drafts what the target chose one position earlier, which a
looping greedy stream accepts, so tests see accepted drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

HIDDEN_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
               "rope_theta", "max_position_embeddings", "vocab_size")


def _target(target_dir: Path) -> tuple[dict, dict]:
    config = json.loads((Path(target_dir) / "config.json").read_text())
    return config.get("text_config") or config, mx.load(str(Path(target_dir) / "model.safetensors"))


def _w(shape, scale=None):
    return mx.random.normal(shape) * (scale if scale is not None else shape[-1] ** -0.5)


def _layer(h: int, heads: int, kv: int, inter: int, echo: bool) -> dict[str, mx.array]:
    d = h // heads
    return {
        "input_layernorm.weight": 1.0 + 0.1 * mx.random.normal((h,)),
        "hidden_norm.weight": 1.0 + 0.1 * mx.random.normal((h,)),
        "post_attention_layernorm.weight": mx.ones((h,)),
        "self_attn.q_proj.weight": _w((heads * d, 2 * h)),
        "self_attn.k_proj.weight": _w((kv * d, 2 * h)),
        "self_attn.v_proj.weight": _w((kv * d, 2 * h)),
        "self_attn.o_proj.weight": mx.zeros((h, heads * d)) if echo else _w((h, heads * d)),
        "mlp.gate_proj.weight": _w((inter, h)),
        "mlp.up_proj.weight": _w((inter, h)),
        "mlp.down_proj.weight": mx.zeros((h, inter)) if echo else _w((h, inter)),
    }


def _draft_vocabulary(vocab: int, draft_vocab: int | None, seed: int) -> np.ndarray | None:
    if draft_vocab is None:
        return None
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(np.arange(3, vocab), size=draft_vocab - 3, replace=False))
    return np.concatenate([np.arange(3), keep]).astype(np.int64)  # the special tokens always in


def _head(target: dict, tcfg: dict, ids: np.ndarray | None, echo: bool, logit_scale: float) -> tuple[mx.array, mx.array]:
    """``lm_head`` and ``norm`` weights: the target's own (echo), else random."""
    h, vocab = tcfg["hidden_size"], tcfg["vocab_size"]
    rows = vocab if ids is None else int(ids.size)
    if echo:
        table = target.get("lm_head.weight", target["model.embed_tokens.weight"])
        head = table if ids is None else table[mx.array(ids)]
        return head, target["model.norm.weight"] * logit_scale
    return _w((rows, h), 0.5), mx.ones((h,)) * logit_scale


def _fc(h: int, n: int, echo: bool) -> mx.array:
    if not echo:
        return _w((h, n * h))
    return mx.concatenate([mx.zeros((h, (n - 1) * h)), mx.eye(h)], axis=1)  # the last listed layer, as is


def build_eagle3(out: Path, target_dir: Path, *, layout: str = "eagle3", aux_ids=(1, 2, 4), draft_vocab: int | None = 256,
                 own_embeddings: bool = False, norm_before_residual: bool | None = None, block: int | None = None,
                 echo: bool = False, seed: int = 21, logit_scale: float = 1.0) -> Path:
    """An EAGLE-3 drafter for the target in ``target_dir``, in ``layout`` ("eagle3" or "speculators");
    ``aux_ids=None`` leaves the layers it reads to the default trio."""
    tcfg, target = _target(target_dir)
    h, heads, kv, inter = (tcfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                               "intermediate_size"))
    vocab = tcfg["vocab_size"]
    mx.random.seed(seed)
    ids = _draft_vocabulary(vocab, draft_vocab, seed)
    layer = _layer(h, heads, kv, inter, echo)
    head, norm = _head(target, tcfg, ids, echo, logit_scale)
    tensors = {"fc.weight": _fc(h, len(aux_ids or (0, 0, 0)), echo), "norm.weight": norm, "lm_head.weight": head}
    if own_embeddings:
        tensors["embed_tokens.weight"] = target["model.embed_tokens.weight"]
    if ids is not None:
        tensors["d2t"] = mx.array(ids - np.arange(ids.size, dtype=np.int64))
        t2d = np.zeros(vocab, dtype=np.bool_)
        t2d[ids] = True
        tensors["t2d"] = mx.array(t2d)
    llama = {k: tcfg[k] for k in HIDDEN_KEYS if k in tcfg}
    llama.update(model_type="llama", num_hidden_layers=1, hidden_act="silu", tie_word_embeddings=False)
    eagle = {"draft_vocab_size": int(ids.size) if ids is not None else vocab}
    if aux_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    if norm_before_residual is not None:
        eagle["norm_before_residual"] = norm_before_residual
    if layout == "eagle3":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **llama, **eagle}
        prefix = "midlayer."
    elif layout == "speculators":
        method = {"proposal_type": "greedy", "speculative_tokens": block or 3, "verifier_accept_k": 1}
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", **eagle,
                  "transformer_layer_config": llama,
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [method],
                                         "verifier": {"architectures": tcfg.get("architectures"),
                                                      "name_or_path": str(target_dir)}}}
        prefix = "layers.0."
    else:
        raise ValueError(layout)
    tensors.update({prefix + k: v for k, v in layer.items()})
    out.mkdir(parents=True, exist_ok=True)
    floats = {k: (v if k in ("d2t", "t2d") else v.astype(mx.float32)) for k, v in tensors.items()}
    mx.save_safetensors(str(out / "model.safetensors"), floats, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


# Hugging Face names (after "midlayer." / "layers.0.") -> llama.cpp's (after "blk.0.")
GGUF_LAYER = {"input_layernorm": "attn_norm", "hidden_norm": "attn_norm_2", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
GGUF_TOP = {"fc": "fc", "input_norm": "enc.output_norm", "norm": "output_norm", "lm_head": "output",
            "embed_tokens": "token_embd"}


def _interleave_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order: within each head, the two rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_eagle3_gguf(src: Path, target_dir: Path, out: Path) -> Path:
    """The GGUF llama.cpp's converter writes for the EAGLE-3 directory ``src`` (``--target-model-dir``)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    config = json.loads((src / "config.json").read_text())
    llama = config.get("transformer_layer_config") or config
    tcfg, _ = _target(target_dir)
    n = tcfg["num_hidden_layers"]
    tensors = {k[len("model."):] if k.startswith("model.") else k: np.asarray(v)
               for k, v in mx.load(str(src / "model.safetensors")).items()}
    writer = GGUFWriter(str(out), "eagle3")
    for key, value in (("block_count", 1), ("context_length", llama["max_position_embeddings"]),
                       ("embedding_length", llama["hidden_size"]), ("feed_forward_length", llama["intermediate_size"]),
                       ("attention.head_count", llama["num_attention_heads"]),
                       ("attention.head_count_kv", llama["num_key_value_heads"]), ("vocab_size", tcfg["vocab_size"]),
                       ("rope.dimension_count", llama["hidden_size"] // llama["num_attention_heads"]),
                       ("target_hidden_size", config.get("target_hidden_size") or tcfg["hidden_size"])):
        writer.add_uint32(f"eagle3.{key}", value)
    writer.add_float32("eagle3.rope.freq_base", llama["rope_theta"])
    writer.add_float32("eagle3.attention.layer_norm_rms_epsilon", llama["rms_norm_eps"])
    layers = config.get("eagle_aux_hidden_state_layer_ids") or [2, n // 2, n - 3]
    writer.add_array("eagle3.target_layers", [int(i) for i in layers])
    writer.add_bool("eagle3.norm_before_residual", bool(config.get("norm_before_residual", False)))
    writer.add_bool("eagle3.norm_before_fc", bool(config.get("norm_before_fc", False)))
    heads = {"attn_q": llama["num_attention_heads"], "attn_k": llama["num_key_value_heads"]}
    for name, value in tensors.items():
        if name == "t2d":
            continue
        if name == "d2t":
            writer.add_tensor("d2t", value.astype(np.int64) + np.arange(value.size, dtype=np.int64),
                              raw_dtype=GGMLQuantizationType.I64)
            continue
        stem, _, suffix = name.rpartition(".")
        for layer_prefix in ("midlayer.", "layers.0."):
            if stem.startswith(layer_prefix):
                stem = "blk.0." + GGUF_LAYER[stem[len(layer_prefix):]]
                break
        else:
            stem = GGUF_TOP[stem]
        if stem.rpartition(".")[2] in heads:
            value = _interleave_rotary(value, heads[stem.rpartition(".")[2]])
        writer.add_tensor(f"{stem}.{suffix}", value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
