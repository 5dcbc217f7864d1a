"""A model's fill-in-the-middle tokens, found as llama.cpp finds them.

Six roles: prefix, suffix and middle (all three are needed for infill), and the optional pad,
repository and file-separator tokens of the repo-level pattern. A GGUF file may name them in its
metadata (``tokenizer.ggml.fim_pre_token_id`` and the rest, or the older
``tokenizer.ggml.prefix_token_id`` / ``suffix_`` / ``middle_``); any role still unknown is looked
up by the token's text among the spellings model families use (``<|fim_prefix|>`` for Qwen,
``<fim_prefix>`` for StarCoder/Granite, ``<PRE>`` / ``▁<PRE>`` for CodeLlama, DeepSeek's
``<｜fim▁begin｜>`` ...). Hugging Face directories have no such metadata: their vocabulary is searched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mlxcel.engine.gguf.special_tokens import FIM_TEXTS

ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")

# role -> GGUF metadata keys, in the order llama.cpp applies them (a later key present wins)
GGUF_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}

# role -> the token texts that play it in the model families llama.cpp recognises (the GGUF
# tokenizer's own table, which also decides which of them end generation)
TEXTS = {role.removeprefix("fim_"): texts for role, texts in FIM_TEXTS.items()}

# what upstream's 501 names for each missing required role
MISSING = {"pre": "prefix token is missing. ", "suf": "suffix token is missing. ", "mid": "middle token is missing. "}


@dataclass(frozen=True)
class FimTokens:
    """Token ids of the fill-in-the-middle roles (None where the vocabulary has none)."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    def missing(self) -> str:
        """Upstream's list of the missing required roles ("" when infill is possible)."""
        return "".join(text for role, text in MISSING.items() if getattr(self, role) is None)


def find_fim_tokens(vocab: Mapping[str, int], n_vocab: int, metadata: Mapping[str, object] | None = None) -> FimTokens:
    """The FIM roles of a vocabulary (``text -> id``, special tokens included), with GGUF
    metadata ids (``metadata``: key -> value) taking precedence; ids outside ``n_vocab`` are ignored."""
    found: dict[str, int | None] = {}
    for role in ROLES:
        chosen = None
        for key in GGUF_KEYS[role]:
            value = (metadata or {}).get(key)
            if isinstance(value, int) and 0 <= value < n_vocab:
                chosen = value
        if chosen is None:
            chosen = next((vocab[t] for t in TEXTS[role] if t in vocab and 0 <= vocab[t] < n_vocab), None)
        found[role] = chosen
    return FimTokens(**found)


def model_fim_tokens(tokenizer, n_vocab: int, metadata: Mapping[str, object] | None = None) -> FimTokens:
    """``find_fim_tokens`` over a loaded tokenizer (an mlx-lm ``TokenizerWrapper`` or a
    ``transformers`` tokenizer) and the model's GGUF metadata ids."""
    tok = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        vocab = tok.get_vocab()
    except Exception:  # a tokenizer without a vocabulary listing: only the metadata can name them
        vocab = {}
    return find_fim_tokens(vocab, n_vocab, metadata)
