"""Incremental detokenization: text deltas as tokens arrive, never splitting a UTF-8 character.

Decoding token by token breaks multi-byte characters and word-boundary spacing, so each step
decodes a short window (from the last settled token) and emits only the new, complete suffix.

Why not mlx-lm's streaming detokenizer (which ``mlxcel generate`` uses): its BPE variant drops the
leading space of the first piece, so a completion would stream "Paris." where llama-server streams
" Paris."; the server must reproduce upstream's text byte for byte.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens already turned into text

    def add(self, token: int) -> str:
        """Append one token; the text it completes (possibly empty)."""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self._prefix:self._read]) if self._read > self._prefix else ""
        after = self.tokenizer.decode(self.tokens[self._prefix:])
        if after.endswith("\ufffd") or len(after) < len(before) or not after.startswith(before):
            if len(self.tokens) - self._read < 8:  # wait for the rest of a multi-byte character
                return ""
        delta = after[len(before):] if after.startswith(before) else after
        self._prefix = self._read
        self._read = len(self.tokens)
        return delta
