"""One sequence's grammar state and the token masks it allows, computed by llguidance.

A :class:`GrammarMatcher` holds exactly the tokens its sequence has emitted since the grammar
began (never the prompt): whoever records an emitted token advances it (:meth:`advance`), and the
sequence ends when the grammar does (:attr:`stopped`: nothing but end-of-sequence could follow).
Asking for masks never moves it: :meth:`masks` walks a block of drafted tokens and comes back,
giving the mask of the pending position and of every drafted one (llguidance's draft-token mask,
computed with the GIL released), and :meth:`admissible` counts how many leading drafts the grammar
allows at all, so a verify round can cut a proposal at its first forbidden draft before the forward.
A rejected draft therefore never reaches the matcher: between rounds it is at the emitted
sequence, as the KV cache is.

Masks are bit-packed rows, one bit per token id (32 per ``int32`` word, lowest bit first), as
llguidance writes them; :func:`allowed_rows` unpacks them into the ``[N, V]`` booleans the sampler
chain applies. :func:`fill_masks` computes many matchers' masks in one call (the server's batched
decode step: every constrained row at once, while the forward runs), with the GIL released: spread
over llguidance's thread pool where the host has cores to spare (a GPU forward), one after another
on the calling thread where the forward keeps every core busy (a CPU; ``device.grammar_mask_threads``).

A matcher compiles its grammar again, against the vocabulary: on ``grammar_stack``'s big stack,
within ``grammar_limits``' parser limits, as the grammar's first compile was (the engine thread's own
stack could not hold every grammar those limits let through).

The grammar tokenizer is built once per model tokenizer (``llguidance.hf.from_tokenizer`` over the
``tokenizers``-library fast tokenizer that mlx-lm's wrapper holds; about 0.3 s for a 49k vocabulary)
and shared by every matcher.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import llguidance
import mlx.core as mx
import numpy as np

from mlxcel.engine.platform.device import grammar_mask_threads
from mlxcel.engine.sampling.grammar import Grammar, GrammarError
from mlxcel.engine.sampling.grammar_limits import parser_limits
from mlxcel.engine.sampling.grammar_stack import on_big_stack

_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_EXECUTOR: llguidance.LLExecutor | None = None


def grammar_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of a model's tokenizer (mlx-lm's ``TokenizerWrapper`` or a
    transformers fast tokenizer), built once and cached. Token ids up to ``vocab_size`` (the
    model's output width) get mask bits; ``eos_token_ids`` are the tokens that end a sequence,
    allowed exactly where the grammar can end."""
    import llguidance.hf  # noqa: PLC0415 - defers transformers (a light import of this module stays light)
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 - defers transformers

    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    if not isinstance(hf, PreTrainedTokenizerFast):
        raise GrammarError(f"grammar-constrained decoding needs a fast (tokenizers-library) tokenizer; this model's "
                           f"is {type(hf).__name__}")
    eos = sorted({int(t) for t in eos_token_ids})
    key = (int(vocab_size), tuple(eos))
    with _LOCK:
        built = _TOKENIZERS.setdefault(tokenizer, {})
        if key not in built:
            n_vocab = max(int(vocab_size), len(hf))
            built[key] = llguidance.hf.from_tokenizer(hf, n_vocab=n_vocab, eos_token=eos or None)
        return built[key]


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = llguidance.LLExecutor(num_threads=grammar_mask_threads())
        return _EXECUTOR


class GrammarMatcher:
    """The grammar state of one sequence (see the module docstring)."""

    def __init__(self, grammar: Grammar, tokenizer: llguidance.LLTokenizer):
        self.grammar = grammar
        self.vocab_size = int(tokenizer.vocab_size)
        self.width = (self.vocab_size + 31) // 32  # int32 words per mask row
        # compiled again, against the vocabulary: on the big stack too (grammar_stack)
        self._m = on_big_stack(lambda: llguidance.LLMatcher(tokenizer, grammar.compiled, log_level=0,
                                                             limits=parser_limits()),
                               what="building the grammar's matcher")
        self._check()
        self.consumed = 0  # tokens advanced over

    def _check(self) -> None:
        if self._m.is_error():
            raise GrammarError(self._m.get_error())

    @property
    def stopped(self) -> bool:
        """The grammar is complete and nothing but end-of-sequence can follow."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The tokens so far form a complete output (end-of-sequence is allowed here)."""
        return self._m.is_accepting()

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows, in order, from the current state."""
        return self._m.validate_tokens([int(t) for t in tokens]) if tokens else 0

    def masks(self, drafts: Sequence[int] = ()) -> np.ndarray:
        """``[len(drafts) + 1, width]`` packed masks: row 0 for the next position, row ``i`` for the
        position after ``drafts[:i]``. ``drafts`` must be admissible. The state is unchanged."""
        (rows,) = fill_masks([(self, drafts)])
        return rows

    def advance(self, tokens: Sequence[int]) -> None:
        """Record emitted tokens (each one the grammar allows)."""
        tokens = [int(t) for t in tokens]
        if tokens and not self._m.consume_tokens(tokens):
            raise GrammarError(f"an emitted token is outside the grammar: {self._m.get_error()}")
        self.consumed += len(tokens)

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens advanced over."""
        if n > 0:
            if not self._m.rollback(n):
                raise GrammarError(f"cannot roll the grammar back by {n} tokens: {self._m.get_error()}")
            self.consumed -= n


def fill_masks(items: Sequence[tuple[GrammarMatcher, Sequence[int]]]) -> list[np.ndarray]:
    """The masks of several matchers in one call: for each ``(matcher, drafts)`` the rows
    ``matcher.masks(drafts)`` gives. Computed with the GIL released (on llguidance's pool when
    ``device.grammar_mask_threads`` allows more than one thread), so a caller can run it while MLX
    evaluates a forward."""
    if not items:
        return []
    width = items[0][0].width
    counts = [len(drafts) + 1 for _, drafts in items]
    out = np.zeros((sum(counts), width), dtype=np.int32)
    if len(items) == 1 or grammar_mask_threads() == 1:
        # on this thread, one matcher after another (each call still releases the GIL): no hand-off
        # to pool threads (see device.grammar_mask_threads)
        parts = np.split(out, np.cumsum(counts)[:-1])
        for (matcher, drafts), rows in zip(items, parts):
            if matcher.width != width:
                raise ValueError("fill_masks: matchers of different vocabularies")
            _fill_one(matcher, [int(t) for t in drafts], rows)
            matcher._check()
        return parts
    plain, drafted, row = [], [], 0
    for (matcher, drafts), n in zip(items, counts):
        if matcher.width != width:
            raise ValueError("fill_masks: matchers of different vocabularies")
        if drafts:
            drafted.append((matcher._m, row, [int(t) for t in drafts]))
        else:
            plain.append((matcher._m, row))
        row += n
    executor = _executor()
    if plain:
        executor.unsafe_compute_mask_ptr(plain, out.ctypes.data, width * 4, out.shape[0])
    if drafted:
        executor.unsafe_compute_mask_ptr_with_draft_token(drafted, out.ctypes.data, width * 4, out.shape[0])
    for matcher, _ in items:
        matcher._check()
    return list(np.split(out, np.cumsum(counts)[:-1]))


def _fill_one(matcher: GrammarMatcher, drafts: list[int], out: np.ndarray) -> None:
    """One matcher's rows: the mask, then each draft consumed and the next mask, then back."""
    m, row_bytes = matcher._m, matcher.width * 4
    for i in range(len(drafts) + 1):
        m.unsafe_compute_mask_ptr(out[i].ctypes.data, row_bytes)
        if i < len(drafts) and not m.consume_token(drafts[i]):
            raise GrammarError(f"draft {i} is outside the grammar: {m.get_error()}")
    if drafts and not m.rollback(len(drafts)):
        raise GrammarError(f"cannot roll the grammar back over {len(drafts)} drafts: {m.get_error()}")


def allowed_rows(masks: np.ndarray, vocab_size: int) -> mx.array:
    """Packed mask rows ``[N, W]`` as booleans ``[N, vocab_size]`` (token ids past the mask are
    not allowed). Unpacked on the host (a few microseconds a row) and handed to MLX once."""
    bits = np.unpackbits(np.ascontiguousarray(masks).view(np.uint8), axis=1, bitorder="little")
    if bits.shape[1] < vocab_size:
        bits = np.pad(bits, ((0, 0), (0, vocab_size - bits.shape[1])))
    return mx.array(bits[:, :vocab_size].view(np.bool_))


def new_matcher(grammar: Grammar, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> GrammarMatcher:
    """A matcher for one sequence of a model (its tokenizer, output width and end tokens)."""
    return GrammarMatcher(grammar, grammar_tokenizer(tokenizer, vocab_size, eos_token_ids))
