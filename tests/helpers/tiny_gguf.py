"""Write tiny GGUF files from the tiny Hugging Face checkpoints of ``tiny_checkpoints``, the way
llama.cpp's convert_hf_to_gguf would: llama.cpp tensor names, the llama q/k row permutation,
the byte-level BPE vocabulary with merges, token types, special ids and the chat template.

``write_gguf`` also writes the *effective* checkpoint: a Hugging Face directory holding exactly
the values the GGUF decodes to (dequantized with the ``gguf`` package's reference code, q/k rows
put back in Hugging Face order). The GGUF loader must reproduce that checkpoint's logits, so a
quantized GGUF is tested as strictly as a float one.

K-quants, IQ and TQ types: ``gguf.quants`` can decode them but not encode them, so those tensors
are filled with random but well-formed blocks (small float16 super-scales, random packed codes);
the effective checkpoint then carries whatever they decode to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q


def build_qwen3_checkpoint(out: Path, *, seed: int = 0) -> Path:
    """A tiny qwen3 checkpoint (q/k RMS norms, explicit head_dim) like ``tiny_checkpoints`` builds."""
    import tiny_checkpoints
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    vocab = tiny_checkpoints.build_tokenizer(out)
    config = tiny_checkpoints.tiny_config("qwen2", vocab)
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32)
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    params["model.embed_tokens.weight"] = mx.random.normal(params["model.embed_tokens.weight"].shape)
    for name in params:
        if name.endswith("_norm.weight"):  # non-trivial norms, so a mixed-up q/k norm shows
            params[name] = 1.0 + 0.3 * mx.random.normal(params[name].shape)
    params.pop("lm_head.weight", None)
    mx.save_safetensors(str(out / "model.safetensors"), {k: v.astype(mx.float32) for k, v in params.items()},
                        metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


# Hugging Face parameter path (after "model.layers.N.") -> llama.cpp tensor name (after "blk.N.").
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def gguf_name(hf: str) -> str:
    stem, suffix = hf.rsplit(".", 1)
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[rest]}.{suffix}"


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k reordering: within each head, HF's half-split rotary layout
    becomes llama.cpp's interleaved one."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk_in_place(model, config: dict) -> None:
    """Put a loaded llama model's q/k rows back into llama.cpp's order: what a loader that skips
    the un-permutation would produce (the tests show that such a model is measurably wrong)."""
    for layer in model.layers:
        attn = layer.self_attn
        attn.q_proj.weight = mx.array(llama_permute(np.array(attn.q_proj.weight), config["num_attention_heads"]))
        attn.k_proj.weight = mx.array(llama_permute(np.array(attn.k_proj.weight), config["num_key_value_heads"]))


# Block types gguf.quants cannot encode: (byte offset, typical magnitude) of each float16 scale field,
# chosen so the decoded weights are a few hundredths, like a small model's. Every other byte of a
# block may hold anything (all codes, grid indices and packed sub-scales are valid).
HALF_SCALES = {
    Q.Q2_K: [(80, 1.0e-3), (82, 1.0e-3)], Q.Q3_K: [(108, 3.0e-4)],
    Q.Q4_K: [(0, 1.5e-4), (2, 2.0e-4)], Q.Q5_K: [(0, 8.0e-5), (2, 1.0e-4)], Q.Q6_K: [(208, 2.5e-4)],
    Q.IQ2_XXS: [(0, 2.0e-4)], Q.IQ2_XS: [(0, 2.0e-4)], Q.IQ2_S: [(0, 2.0e-4)],
    Q.IQ3_XXS: [(0, 1.0e-4)], Q.IQ3_S: [(0, 1.0e-4)], Q.IQ1_S: [(0, 2.0e-3)],
    Q.IQ4_NL: [(0, 3.0e-4)], Q.IQ4_XS: [(0, 2.0e-5)], Q.TQ1_0: [(52, 3.0e-2)], Q.TQ2_0: [(64, 3.0e-2)],
}
ENCODABLE = (Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4)


def random_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Well-formed random blocks of ``qtype`` (any quantized type ``gguf.quants`` decodes) for a
    ``rows x cols`` matrix, as raw bytes: random codes, float16 scales of the size in
    ``HALF_SCALES`` (Q6_K's int8 sub-scales kept within +-12, as a quantizer leaves them)."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * (cols // block)
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for at, magnitude in HALF_SCALES.get(qtype, []):
        raw[:, at:at + 2] = (magnitude * rng.uniform(0.5, 1.5, (n, 1))).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # ql[128] qh[64] scales[16] (int8) d (f16, last)
        raw[:, 192:208] = rng.integers(-12, 13, size=(n, 16)).astype(np.int8).view(np.uint8)
    elif qtype == Q.IQ1_M:  # the f16 scale is the top nibble of each of the last four uint16
        d = (2.0e-3 * rng.uniform(0.5, 1.5, n)).astype(np.float16).view(np.uint16)
        scales = raw[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for i in range(4):
            scales[:, i] |= ((d >> np.uint16(4 * i)) & np.uint16(0xF)) << np.uint16(12)
        raw[:, 48:56] = scales.view(np.uint8)
    elif qtype == Q.MXFP4:  # E8M0 exponent byte: 2^-9 .. 2^-6
        raw[:, 0] = rng.integers(118, 122, size=n)
    elif qtype not in HALF_SCALES:
        raise ValueError(f"no random block recipe for {qtype.name}")
    return raw.reshape(rows, -1)


def encode(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """``w`` stored as ``qtype``: float arrays for F32/F16, ``w`` quantized for the types
    ``gguf.quants`` encodes, random well-formed blocks (``random_blocks``) for the others."""
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype not in ENCODABLE:
        return random_blocks(w.shape[0], w.shape[1], qtype, rng)
    return quants.quantize(w.astype(np.float32), qtype)


def decode(stored: np.ndarray, qtype: Q) -> np.ndarray:
    if qtype in (Q.F32, Q.F16):
        return stored.astype(np.float32)
    return quants.dequantize(stored, qtype).astype(np.float32)


TypeChooser = Callable[[str, tuple[int, ...]], Q]


def uniform(qtype: Q) -> TypeChooser:
    """Every matrix stored as ``qtype`` (where its row length allows), vectors as F32."""

    def choose(name: str, shape: tuple[int, ...]) -> Q:
        if len(shape) < 2 or shape[-1] % GGML_QUANT_SIZES[qtype][0]:
            return Q.F32
        return qtype

    return choose


def mixed(mapping: dict[str, Q], default: Q = Q.F32) -> TypeChooser:
    """Per-tensor types by GGUF name fragment (first match wins), e.g. ``{"attn_q": Q.Q4_0}``."""

    def choose(name: str, shape: tuple[int, ...]) -> Q:
        if len(shape) < 2:
            return Q.F32
        for fragment, qtype in mapping.items():
            if fragment in name and shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0:
                return qtype
        return default

    return choose


def write_gguf(
    hf_dir: Path,
    out: Path,
    types: TypeChooser = uniform(Q.F32),
    *,
    seed: int = 0,
    architecture: str | None = None,
    extra_tensors: dict[str, tuple[np.ndarray, Q]] | None = None,
    effective_dir: Path | None = None,
    extra_metadata: dict[str, int | str] | None = None,
) -> Path:
    """Convert the checkpoint in ``hf_dir`` to a GGUF at ``out`` (returned). With
    ``effective_dir``, also write the checkpoint the GGUF decodes to there.
    ``architecture`` overrides general.architecture (to test refusals); ``extra_tensors``
    adds raw tensors as they are (name -> (bytes or floats, type)); ``extra_metadata`` adds keys
    (an int as uint32, a string as a string)."""
    config = json.loads((hf_dir / "config.json").read_text())
    tok_json = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    arch = config["model_type"]
    params = {k: np.array(v, dtype=np.float32) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}
    rng = np.random.default_rng(seed)

    writer = GGUFWriter(str(out), architecture or arch)
    writer.add_string("general.name", f"tiny-{arch}")
    prefix = architecture or arch
    writer.add_uint32(f"{prefix}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{prefix}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{prefix}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{prefix}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{prefix}.attention.head_count", config["num_attention_heads"])
    writer.add_uint32(f"{prefix}.attention.head_count_kv", config["num_key_value_heads"])
    writer.add_float32(f"{prefix}.rope.freq_base", config["rope_theta"])
    writer.add_float32(f"{prefix}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_uint32(f"{prefix}.rope.dimension_count", head_dim)
    if "head_dim" in config:
        writer.add_uint32(f"{prefix}.attention.key_length", head_dim)
        writer.add_uint32(f"{prefix}.attention.value_length", head_dim)
    writer.add_uint32(f"{prefix}.vocab_size", config["vocab_size"])

    # Tokenizer: the vocabulary in id order, its merges, which tokens are control tokens.
    vocab = dict(tok_json["model"]["vocab"])
    special = {t["content"] for t in tok_json.get("added_tokens", []) if t.get("special")}
    for t in tok_json.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    # transformers loads a qwen2 checkpoint's tokenizer with Qwen2's split regex whatever
    # tokenizer.json says (not so for qwen3), so that is the original a converter would detect.
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([TOKEN_CONTROL if t in special else TOKEN_NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab[tok_config["eos_token"]])
    writer.add_pad_token_id(vocab[tok_config["pad_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok_config["chat_template"])
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)

    effective: dict[str, np.ndarray] = {}
    for hf, w in params.items():
        name = gguf_name(hf)
        n_head = None
        if arch == "llama" and ".attn_q." in name:
            n_head = config["num_attention_heads"]
        elif arch == "llama" and ".attn_k." in name:
            n_head = config["num_key_value_heads"]
        if n_head is not None:
            w = llama_permute(w, n_head)
        qtype = types(name, w.shape)
        stored = encode(w, qtype, rng)
        writer.add_tensor(name, stored, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
        value = decode(stored, qtype).reshape(w.shape)
        if n_head is not None:  # back to Hugging Face order, by inverting the forward index map
            order = llama_permute(np.arange(w.shape[0]), n_head)
            value = value[np.argsort(order)]
        effective[hf] = value
    for name, (data, qtype) in (extra_tensors or {}).items():
        writer.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    if effective_dir is not None:
        effective_dir.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (hf_dir / f).exists():
                shutil.copy(hf_dir / f, effective_dir / f)
        mx.save_safetensors(str(effective_dir / "model.safetensors"),
                            {k: mx.array(v) for k, v in effective.items()}, metadata={"format": "pt"})
    return out
