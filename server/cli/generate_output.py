"""What ``mlxcel generate`` writes: the text as it streams, the token budget it decodes to, and the
one-line performance summary. Shared by the plain and the speculative paths."""

from __future__ import annotations

import argparse
from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from mlxcel.engine.errors import PromptError


def max_new_tokens(args: argparse.Namespace, loaded, prompt_len: int) -> int:
    """``-n``, with -1 meaning "until the context is full"; without a rotating cache
    (``--max-kv-size``) generation never runs past the model's context."""
    context = loaded.context_length
    if args.max_kv_size is None and prompt_len >= context:
        raise PromptError(f"the prompt ({prompt_len} tokens) does not fit the model's context ({context} tokens)")
    room = max(context - prompt_len, 0)
    if args.n_predict < 0:
        return room
    return args.n_predict if args.max_kv_size is not None else min(args.n_predict, room)


def make_cache(loaded, args: argparse.Namespace) -> list[Any]:
    if args.max_kv_size is None:
        return loaded.make_cache()
    return make_prompt_cache(loaded.model, max_kv_size=args.max_kv_size)


def format_summary(last) -> str:
    return (f"[Performance] prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.1f} tokens/s | "
            f"generation: {last.generation_tokens} tokens, {last.generation_tps:.1f} tokens/s | "
            f"peak memory: {last.peak_memory_gb:.2f} GB")


class TextOut:
    """Writes generated tokens' text to ``out`` as it becomes printable (the tokenizer's streaming
    detokenizer holds back incomplete characters). Tokens in ``skip`` (end-of-generation tokens,
    unless ``--ignore-eos``) are not text."""

    def __init__(self, tokenizer, out, skip=frozenset()):
        self.detok = tokenizer.detokenizer
        self.detok.reset()
        self.out = out
        self.skip = skip

    def add(self, tokens) -> None:
        for token in tokens:
            if token not in self.skip:
                self.detok.add_token(token)
        segment = self.detok.last_segment  # reading it consumes it
        if segment:
            self.out.write(segment)
            self.out.flush()

    def close(self) -> None:
        self.detok.finalize()
        self.out.write(self.detok.last_segment + "\n")
        self.out.flush()
