"""Rebuild a model's tokenizer from GGUF metadata with the ``tokenizers`` library.

transformers can read a GGUF tokenizer too, but its GGUF path imports torch; this module needs
only ``tokenizers`` and wraps the result as ``PreTrainedTokenizerFast`` (for chat templates) and
then mlx-lm's ``TokenizerWrapper`` (for the streaming detokenizer and eos set).

Three vocabulary kinds are handled:

- ``gpt2``: byte-level BPE from ``tokenizer.ggml.tokens`` + ``merges``; the split before BPE
  is chosen by ``tokenizer.ggml.pre`` (llama.cpp's name for the original tokenizer's regex);
- ``llama``: SentencePiece-style BPE with byte fallback; merges are derived from the token
  scores when the file has none (as Hugging Face's own SentencePiece converter does);
- ``bert``: WordPiece (BERT-family embedders), the converter's "phantom space" spelling undone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    SPMStreamingDetokenizer,
    TokenizerWrapper,
)
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.gguf.special_tokens import CONTROL, NORMAL, TokenRoles, token_roles

log = logging.getLogger(__name__)


# Split patterns of the original tokenizers, keyed by tokenizer.ggml.pre: the regexes llama.cpp
# applies in turn (llama-vocab.cpp), written as the tokenizer.json they come from has them where
# llama.cpp rewrote them for its own regex engine (case-insensitive groups, \p{Lu}-style classes).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
              r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
# (three ranges end in Greek letters with a canonical decomposition; they are written as
# escapes for the codepoints the original tokenizer has, U+1F7D, U+1FD3, U+1FDB, not their NFC forms)
_DEEPSEEK_LLM = [r"[\r\n]",
                 r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                 r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text before byte-level BPE for one ``tokenizer.ggml.pre``."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a whole word in the vocabulary is one token, merges or not
    add_bos: bool = False  # llama.cpp's default when the file does not say


def _pre(*regexes: str, ignore_merges: bool = False, add_bos: bool = False) -> PreTokenizer:
    return PreTokenizer(tuple(regexes), ignore_merges, add_bos)


_FAMILIES: list[tuple[tuple[str, ...], PreTokenizer]] = [
    (("default",), _pre(r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    (("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4", "mellum", "a.x-4.0",
      "gigachat", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "modern-bert", "jina-v1-en", "jina-v2-code",
      "roberta-bpe"), _pre(_GPT2)),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
     _pre(r"\p{N}", _GPT2)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     _pre(_LLAMA3, ignore_merges=True, add_bos=True)),
    (("dbrx", "smaug-bpe"), _pre(_LLAMA3)),
    (("chatglm-bpe",), _pre(_LLAMA3)),
    (("glm4", "glm5"), _pre(_LLAMA3, ignore_merges=True)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
     _pre(_QWEN2)),
    (("qwen35",), _pre(_QWEN35)),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _pre(_GPT4O)),
    (("tekken",), _pre(_TEKKEN, ignore_merges=True, add_bos=True)),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _pre(*_DEEPSEEK3)),
    (("deepseek-llm",), _pre(*_DEEPSEEK_LLM)),
    (("deepseek-coder",), _pre(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")),
    (("falcon",), _pre(r"[\p{P}\$\+<=>\^~\|`]+", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                       r"[0-9][0-9][0-9]")),
    (("viking",), _pre(_BLOOM, r"\p{N}")),
    (("bloom", "poro-chat", "gpt3-finnish"), _pre(_BLOOM)),
    (("seed-coder",), _pre(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")),
    (("bailingmoe", "bailingmoe2", "llada-moe"), _pre(r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                                                       r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")),
    (("laguna",), _pre(r"[^\n]+|[\n]+", _QWEN2)),
    (("exaone-moe",), _pre(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")),
    (("minicpm5",), _pre(r"\p{N}{1,3}", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)),
    (("ufakzeka",), _pre(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
]
PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: pre for names, pre in _FAMILIES for name in names}


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
    sep: int | None = None  # the separator (a WordPiece vocabulary closes every text with it)


def special_ids(metadata: dict[str, Any], n_tokens: int, roles: TokenRoles | None = None) -> SpecialIds:
    if roles is None:
        tokens = list(metadata.get("tokenizer.ggml.tokens") or [])
        types = metadata.get("tokenizer.ggml.token_type")
        roles = token_roles(metadata, tokens, [int(t) for t in types] if types is not None else [NORMAL] * len(tokens))

    def tid(name: str) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        return int(value) if value is not None and 0 <= int(value) < n_tokens else None

    kind = metadata.get("tokenizer.ggml.model")
    bos, unk, sep = tid("bos"), tid("unknown"), tid("seperator")  # (llama.cpp's spelling of the key)
    if kind == "bert":  # llama.cpp's WordPiece defaults for ids a file leaves out
        bos, unk, sep = (i if i is not None else (d if d < n_tokens else None)
                         for i, d in ((bos, 101), (unk, 100), (sep, 102)))
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:  # llama.cpp's defaults: SentencePiece and WordPiece add BOS; byte-level BPE as its pre-tokenizer says
        pre = PRE_TOKENIZERS.get(str(metadata.get("tokenizer.ggml.pre") or "default"))
        add_bos = kind in ("llama", "bert") or (kind == "gpt2" and pre is not None and pre.add_bos)
    return SpecialIds(
        bos=bos, eos=tid("eos"), eot=tid("eot"), eom=tid("eom"), unk=unk, pad=tid("padding"),
        add_bos=bool(add_bos) and bos is not None,
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and tid("eos") is not None,
        eog=frozenset(roles.eog), sep=sep,
    )


def build_tokenizers_object(metadata: dict[str, Any], source: str) -> tuple[Tokenizer, SpecialIds]:
    """A ``tokenizers.Tokenizer`` equivalent to the one the GGUF was converted from."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ModelLoadError(f"{source} has no tokenizer (tokenizer.ggml.model/tokens missing)")
    tokens = list(tokens)
    types = metadata.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None else [NORMAL] * len(tokens)
    roles = token_roles(metadata, tokens, types)
    ids = special_ids(metadata, len(tokens), roles)
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicated string keeps its first id, as llama.cpp does

    if kind == "gpt2":
        tok = _byte_level_bpe(metadata, vocab, source)
    elif kind == "llama":
        tok = _sentencepiece_bpe(metadata, tokens, vocab, ids)
    elif kind == "bert":
        tok = _wordpiece(metadata, tokens, types, ids)
    else:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer model {kind!r} in {source}; mlxcel reads 'gpt2' (byte-level BPE), "
            "'llama' (SentencePiece) and 'bert' (WordPiece) vocabularies"
        )

    # Control and user-defined tokens (as llama.cpp decides them, special_tokens.py) are matched
    # whole, never split by the pre-tokenizer.
    added = []
    for i in sorted(roles.control | roles.user_defined):
        text = tokens[i]
        if vocab.get(text) != i:
            continue
        added.append(AddedToken(text, special=i in roles.control, normalized=False))
    tok.add_special_tokens([t for t in added if t.special])
    tok.add_tokens([t for t in added if not t.special])

    single, pair, specials = "$A", "$B", []
    if kind == "bert" and ids.bos is not None and ids.sep is not None:
        # llama.cpp's WordPiece tokenizer opens every text with BOS and closes it with the separator
        cls, sep = tokens[ids.bos], tokens[ids.sep]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, ids.bos), (sep, ids.sep)])
        return tok, ids
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
    pre = pre_tokenizer(metadata, source)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre.ignore_merges))
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _wordpiece(metadata: dict[str, Any], tokens: list[str], types: list[int], ids: SpecialIds) -> Tokenizer:
    """A WordPiece tokenizer that splits as llama.cpp's (``llm_tokenizer_wpm``): BERT's
    normalisation (lowercasing and accent stripping as the file's ``normalizer.*`` keys say, both on
    by default), whitespace and punctuation splits, CJK characters alone, then the longest vocabulary
    match from the start of each word, a word that does not tokenize whole being ``[UNK]``.

    The converter stores a word-initial piece as ``\u2581piece`` and a continuation ``##piece`` as
    ``piece`` (control tokens as they are); here they are spelled back the WordPiece way."""
    vocab: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL:
            spelled = text
        elif text.startswith("\u2581"):
            spelled = text[1:]
        else:
            spelled = "##" + text
        if spelled:
            vocab.setdefault(spelled, i)
    unk = tokens[ids.unk] if ids.unk is not None else "[UNK]"
    # llama.cpp matches a word of any length; Hugging Face's default gives up past 100 characters
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=1 << 30))
    lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def pre_tokenizer(metadata: dict[str, Any], source: str) -> PreTokenizer:
    """The split a byte-level vocabulary's ``tokenizer.ggml.pre`` names. llama.cpp refuses a
    name it does not know; so do we, naming it."""
    name = str(metadata.get("tokenizer.ggml.pre") or "default")
    if name not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{source}: unknown pre-tokenizer {name!r} (tokenizer.ggml.pre); mlxcel knows "
            + ", ".join(sorted(PRE_TOKENIZERS))
        )
    return PRE_TOKENIZERS[name]


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
    elif metadata.get("tokenizer.ggml.model") == "bert":
        detok = NaiveStreamingDetokenizer
    else:
        detok = BPEStreamingDetokenizer
    return TokenizerWrapper(hf, detokenizer_class=detok, eos_token_ids=set(ids.eog)), ids
