"""Rebuild a model's tokenizer from GGUF metadata with the ``tokenizers`` library.

transformers can read a GGUF tokenizer too, but its GGUF path imports torch; this module needs
only ``tokenizers`` and wraps the result as ``PreTrainedTokenizerFast`` (for chat templates) and
then mlx-lm's ``TokenizerWrapper`` (for the streaming detokenizer and eos set).

Two vocabulary kinds are handled:

- ``gpt2``: byte-level BPE from ``tokenizer.ggml.tokens`` + ``merges``; the split before BPE
  is chosen by ``tokenizer.ggml.pre`` (llama.cpp's name for the original tokenizer's regex);
- ``llama``: SentencePiece-style BPE with byte fallback; merges are derived from the token
  scores when the file has none (as Hugging Face's own SentencePiece converter does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from mlxcel.engine.errors import ModelLoadError

log = logging.getLogger(__name__)

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Split patterns of the original tokenizers, keyed by tokenizer.ggml.pre.
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre name -> (regex applied before the byte-level step or None for GPT-2's own,
#              split digits one by one first, BPE ignore_merges)
PRE_TOKENIZERS: dict[str, tuple[str | None, bool, bool]] = {
    "gpt-2": (None, False, False),
    "gpt2": (None, False, False),
    "mpt": (None, False, False),
    "olmo": (None, False, False),
    "jais": (None, False, False),
    "smollm": (None, True, False),
    "starcoder": (None, True, False),
    "refact": (None, True, False),
    "command-r": (None, True, False),
    "codeshell": (None, True, False),
    "exaone": (None, True, False),
    "minerva-7b": (None, True, False),
    "llama3": (_LLAMA3_PATTERN, False, True),
    "llama-v3": (_LLAMA3_PATTERN, False, True),
    "llama-bpe": (_LLAMA3_PATTERN, False, True),
    "falcon3": (_LLAMA3_PATTERN, False, True),
    "qwen2": (_QWEN2_PATTERN, False, False),
    "deepseek-r1-qwen": (_QWEN2_PATTERN, False, False),
    "stablelm2": (_QWEN2_PATTERN, False, False),
    "megrez": (_QWEN2_PATTERN, False, False),
}


# Token texts llama.cpp treats as end-of-generation whatever the metadata says (it decides EOG
# by text; see llama-vocab.cpp), and its fill-in-the-middle pad/repo/separator candidates,
# which it also counts as EOG.
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
}
FIM_CANDIDATES = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


@dataclass
class SpecialIds:
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool
    eog: frozenset[int] = frozenset()  # every token that ends generation, as llama.cpp decides


def special_ids(metadata: dict[str, Any], n_tokens: int) -> SpecialIds:
    def tid(name: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        return int(value) if value is not None and 0 <= int(value) < n_tokens else None

    kind = metadata.get("tokenizer.ggml.model")
    bos = tid("bos")
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:  # llama.cpp's defaults: SentencePiece vocabularies add BOS, byte-level BPE ones do not
        add_bos = kind == "llama"
    return SpecialIds(
        bos=bos, eos=tid("eos"), eot=tid("eot"), eom=tid("eom"), unk=tid("unknown"), pad=tid("padding"),
        add_bos=bool(add_bos) and bos is not None,
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and tid("eos") is not None,
        eog=frozenset(_eog_ids(metadata, tid)),
    )


def _eog_ids(metadata: dict[str, Any], tid) -> set[int]:
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    by_text: dict[str, int] = {}
    for i, text in enumerate(tokens):
        by_text.setdefault(text, i)
    eog = {by_text[t] for t in EOG_TEXTS if t in by_text}
    for kind, candidates in FIM_CANDIDATES.items():
        found = tid(kind)
        if found is None:
            found = next((by_text[t] for t in candidates if t in by_text), None)
        if found is not None:
            eog.add(found)
    eog.update(i for i in (tid("eos"), tid("eot"), tid("eom")) if i is not None)
    return eog


def build_tokenizers_object(metadata: dict[str, Any], source: str) -> tuple[Tokenizer, SpecialIds]:
    """A ``tokenizers.Tokenizer`` equivalent to the one the GGUF was converted from."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ModelLoadError(f"{source} has no tokenizer (tokenizer.ggml.model/tokens missing)")
    tokens = list(tokens)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None else [NORMAL] * len(tokens)
    ids = special_ids(metadata, len(tokens))
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicated string keeps its first id, as llama.cpp does

    if kind == "gpt2":
        tok = _byte_level_bpe(metadata, vocab, source)
    elif kind == "llama":
        tok = _sentencepiece_bpe(metadata, tokens, vocab, ids)
    else:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer model {kind!r} in {source}; mlxcel reads 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece) vocabularies"
        )

    # Control and user-defined tokens are matched whole, never split by the pre-tokenizer.
    added = []
    for i, (text, ttype) in enumerate(zip(tokens, types)):
        if vocab.get(text) != i:
            continue
        if ttype == CONTROL:
            added.append(AddedToken(text, special=True, normalized=False))
        elif ttype == USER_DEFINED:
            added.append(AddedToken(text, special=False, normalized=False))
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])

    single, pair, specials = "$A", "$B", []
    if ids.add_bos:
        single, pair = f"{tokens[ids.bos]}:0 {single}", f"{tokens[ids.bos]}:1 {pair}"
        specials.append((tokens[ids.bos], ids.bos))
    if ids.add_eos:
        single, pair = f"{single} {tokens[ids.eos]}:0", f"{pair} {tokens[ids.eos]}:1"
        specials.append((tokens[ids.eos], ids.eos))
    if specials:
        tok.post_processor = processors.TemplateProcessing(single=single, pair=f"{single} {pair}", special_tokens=specials)
    return tok, ids


def _byte_level_bpe(metadata: dict[str, Any], vocab: dict[str, int], source: str) -> Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or []]
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        log.warning("%s: unknown pre-tokenizer %r; splitting text as GPT-2 does, which may tokenize "
                    "some inputs differently from llama.cpp", source, pre)
    pattern, split_digits, ignore_merges = PRE_TOKENIZERS.get(pre, PRE_TOKENIZERS["gpt-2"])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               ignore_merges=ignore_merges))
    steps = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if pattern is not None:
        steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pattern is None))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(metadata: dict[str, Any], tokens: list[str], vocab: dict[str, int], ids: SpecialIds) -> Tokenizer:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges:
        merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = metadata.get("tokenizer.ggml.scores")
        merge_pairs = merges_from_scores(tokens, vocab, scores)
    unk = tokens[ids.unk] if ids.unk is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def merges_from_scores(tokens: list[str], vocab: dict[str, int], scores) -> list[tuple[str, str]]:
    """BPE merges for a SentencePiece vocabulary: every split of a token into two tokens is a
    merge, ranked by the merged token's score (higher first), ties by the parts' ids."""
    if scores is None:
        scores = [-float(i) for i in range(len(tokens))]
    found = []
    for piece, pid in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-float(scores[pid]), vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def build_tokenizer(metadata: dict[str, Any], source: str):
    """An mlx-lm ``TokenizerWrapper`` around a ``PreTrainedTokenizerFast`` built from the GGUF vocabulary.

    Returns ``(wrapper, special_ids)``."""
    tok, ids = build_tokenizers_object(metadata, source)
    tokens = metadata["tokenizer.ggml.tokens"]

    def text(i: int | None) -> str | None:
        return tokens[i] if i is not None else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=text(ids.bos),
        eos_token=text(ids.eos),
        unk_token=text(ids.unk),
        pad_token=text(ids.pad),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    if metadata.get("tokenizer.ggml.model") == "llama":
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        detok = lambda t: SPMStreamingDetokenizer(t, trim_space=prefix)  # noqa: E731
    else:
        detok = BPEStreamingDetokenizer
    return TokenizerWrapper(hf, detokenizer_class=detok, eos_token_ids=set(ids.eog)), ids
