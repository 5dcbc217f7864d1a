"""Token ids as text and bytes, for ``/tokenize`` pieces and log-probability entries.

A token can be part of a multi-byte character, so its text alone is not always valid UTF-8: its
raw bytes come from the tokenizer's byte-level alphabet (GPT-2 style ``Ġ`` mapping) or
SentencePiece's ``<0xNN>`` byte tokens.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}

    def token_bytes(self, token: int) -> bytes:
        cached = self._cache.get(token)
        if cached is not None:
            return cached
        raw = self._raw_bytes(token)
        self._cache[token] = raw
        return raw

    def _raw_bytes(self, token: int) -> bytes:
        text = self.tokenizer.decode([token])
        if "\ufffd" not in text:
            return text.encode("utf-8")
        piece = self.tokenizer.convert_ids_to_tokens(token) if hasattr(self.tokenizer, "convert_ids_to_tokens") \
            else getattr(self.tokenizer, "_tokenizer").convert_ids_to_tokens(token)
        if piece is None:
            return text.encode("utf-8")
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            return bytes([int(piece[3:5], 16)])
        decoder = _byte_decoder()
        if all(ch in decoder for ch in piece):
            return bytes(decoder[ch] for ch in piece)
        return piece.replace("\u2581", " ").encode("utf-8")

    def text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def piece(self, token: int):
        """The piece as upstream's ``with_pieces`` gives it: a string when valid UTF-8, else bytes."""
        raw = self.token_bytes(token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)
